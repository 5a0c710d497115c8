"""User-facing tools around training: `yxanul bench` (bench.py), `yxanul compare` (compare.py),
`yxanul lint-config` (lint_config.py: lint/files.py's command, its train config validated as train does),
`yxanul plot-lr` (plot_lr.py), `yxanul prepare` (prepare.py: the data layer's `prepare` as a command) and
`yxanul verify` (verify.py). Each module's ``main(argv)`` is the
command; each parses its flags from a dataclass with :func:`yxanul.flags.parse_command`."""
