"""The `zoe` command of a pip-installed zoe: runs the zoe executable shipped in the package
(zoe/bin/zoe, which finds libzoe.so beside it), with the same arguments, exit status and output."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "zoe")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"zoe: error: the zoe executable is missing from the installed package ({exe}); "
                         "reinstall with pip install .\n")
        return 2
    # `zoe verify --hf-config` runs the model through this package, in this interpreter.
    os.environ.setdefault("ZOE_PYTHON", sys.executable)
    os.execv(exe, [exe] + sys.argv[1:])
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
