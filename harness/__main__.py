"""``harness``: see harness/cli.py.  Ctrl-C while the harness is still starting exits 130 quietly too."""

try:
    from llm_inference_harness.cli import main

    raise SystemExit(main())
except KeyboardInterrupt:
    raise SystemExit(130) from None
