"""Names vulture reports as unused that are used where it cannot see.

Read by `make lint` (vulture python/tiertp tests tools/vulture_whitelist.py);
never imported or run. Each line "uses" a name (`_.name`: an attribute or
method of that name), with why it is not dead. Only false positives belong
here: code that is really unused is removed, not listed.
"""

# --- required by a signature we implement -----------------------------------
exc  # `def __exit__(self, *exc)`: the context-manager protocol passes it
forward_batch  # weights/sglang_llama.py: SGLang calls the MLP's forward(x, forward_batch=None)
_.download_model  # weights/sglang_llama.py: BaseModelLoader's abstract method, called by SGLang

# --- attributes a library reads ----------------------------------------------
_.full_untruncated_fill_ids  # execution/rank_kv.py: set on SGLang's Req, read by SGLang's batch code
_.logprob_start_len  # same
_.kv_committed_len  # same (Req.kv)
_.prefix_len  # same, before an extend
_.extend_end  # same
_.pre_tokenizer  # tests/test_replay_live_client.py: read by the `tokenizers` Tokenizer
pytestmark  # tests: read by pytest
released_bytes  # weights/bind.py BindStats: reported through dataclasses.asdict (weights/verify.py)
store_bytes  # same

# --- called by name: "module:function" strings run in another process --------
measure  # tests/compare_runners.py: run_isolated("compare_runners:measure")
measure_level  # profiling/measure.py: run_isolated("tiertp.profiling.measure:measure_level")
bind_store  # switching/weight_binder.py: WEIGHT_BINDER = "tiertp.switching.weight_binder:bind_store"
compare_level  # weights/verify.py: run_isolated("tiertp.weights.verify:compare_level")
generate_ids  # tests/sglang_generate.py: run_isolated("sglang_generate:generate_ids")
refuse_unknown_model  # tests/test_weights_sglang.py: run_isolated("test_weights_sglang:refuse_unknown_model")
