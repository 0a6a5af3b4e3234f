"""``python -m simkit``: the same as the ``simkit`` console script."""

try:
    from simkit.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line loads: one line, as in main()
    import sys

    print("simkit: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
