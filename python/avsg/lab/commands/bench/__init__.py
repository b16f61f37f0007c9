"""``avsg bench ...``: the benchmarks, one module each (the table is ``avsg.commands.COMMANDS``).
Each prints its ratios against the baselines of the same run and writes JSON under ``--out``;
docs/benchmarks.md describes them."""
