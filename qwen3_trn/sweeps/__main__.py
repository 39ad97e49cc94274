"""python -m qwen3_trn.sweeps <sweep dir>: a finished sweep's summary, printed again."""

from qwen3_trn.cli.exits import imports_of_entry_point

# A torchtitan that lacks what the package uses: exit 2 as the command (qwen3_trn.cli.exits).
with imports_of_entry_point(__name__):
    from qwen3_trn.sweeps.sweep import main

if __name__ == "__main__":
    main()
