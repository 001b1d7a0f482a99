"""Subcommands of the `tiertp` CLI (listed once, in tiertp.cli.COMMANDS)."""
