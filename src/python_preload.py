# A pre-started Python for a warm sandbox of a language profile with
# `preload` (src/languages.rs): run as `python3 -c <this> MODULE...`, it
# imports the modules ahead with its output thrown away, then waits for
# one line on stdin (the runner's: the script and its arguments, NUL
# separated, hex-encoded) and runs the script as `python3 SCRIPT ARGS...`
# would: the same sys.argv, sys.path[0], __main__ globals, tracebacks and
# exit status, stdin at end-of-file. A module that fails to import is left
# for the script to import (and fail on) itself.


def _bootstrap():
    import os
    import sys
    from importlib.machinery import SourceFileLoader

    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    try:
        for name in sys.argv[1:]:
            try:
                __import__(name)
            except BaseException:
                pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])

    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            os._exit(0)
        line += byte
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    argv = [os.fsdecode(arg) for arg in bytes.fromhex(line.decode("ascii").strip()).split(b"\0")]
    path = os.path.abspath(argv[0])
    sys.orig_argv = sys.orig_argv[:1] + argv
    sys.argv = argv
    sys.path[0] = os.path.dirname(path)

    # The script's globals, as `python3 SCRIPT` gives them: none of ours.
    main = sys.modules["__main__"].__dict__
    for name in list(main):
        if name not in ("__name__", "__builtins__"):
            del main[name]
    main.update(
        __doc__=None,
        __package__=None,
        __spec__=None,
        __annotations__={},
        __file__=path,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", path),
    )
    try:
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec")
        exec(code, main)
    except SystemExit:
        raise
    except BaseException as error:
        # The traceback from the script's own frames, as python3 SCRIPT
        # prints it (none for a syntax error).
        trace = error.__traceback__
        while trace is not None and trace.tb_frame.f_code.co_filename == "<string>":
            trace = trace.tb_next
        sys.excepthook(type(error), error.with_traceback(trace), trace)
        sys.exit(1)


_bootstrap()
