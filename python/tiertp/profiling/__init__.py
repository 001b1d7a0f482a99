"""`tiertp profile` (measuring mode): TP performance tables from the real engine.

grid (what is measured), measure (in the engine's processes), checkpoint
(resumable results), writer (the validated profile file), provenance, run_profile
(the whole run), cli (arguments).
"""
