try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI's modules load: one line, not a traceback
    import sys

    sys.stderr.write("asyncckpt: interrupted (SIGINT) while starting; nothing was written\n")
    raise SystemExit(130) from None

raise SystemExit(main())
