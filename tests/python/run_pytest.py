"""Runs one pytest file for ctest; exits 77 (ctest's SKIP_RETURN_CODE) when pytest or a module
the file needs is not installed (Debian: python3-pytest, python3-torch, python3-numpy,
python3-matplotlib; scripts/install-deps.sh installs them).

usage: run_pytest.py REQUIRED_MODULES(comma separated; - for none) TEST_FILE [pytest args...]"""
import importlib.util
import sys


def main():
    required, test_file, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    wanted = ["pytest"] + [m for m in required.split(",") if m and m != "-"]
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        names = ", ".join(missing)
        print(f"skipping {test_file}: Python module(s) {names} not installed for {sys.executable}")
        return 77
    import pytest

    return pytest.main(["-q", "-p", "no:cacheprovider", test_file, *rest])


if __name__ == "__main__":
    sys.exit(main())
