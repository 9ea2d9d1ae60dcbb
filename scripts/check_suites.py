#!/usr/bin/env python3
"""Checks that every suite named in tests/suites.txt ran: a C++ suite must be registered with ctest, a pytest file
must have been collected. A suite that CMake skipped, that was not built, or whose file is gone fails the test run.

    check_suites.py SUITES_TXT CTEST_LIST_JSON PYTEST_JUNIT_XML [--cuda]

CTEST_LIST_JSON is `ctest --show-only=json-v1`; PYTEST_JUNIT_XML is pytest's --junitxml with junit_family=xunit1
(each testcase names its file). --cuda: the build has the CUDA backends, so the suites marked `cuda` are required.
"""
import json
import pathlib
import sys
import xml.etree.ElementTree as ET


def expected(path, cuda):
    suites = []
    for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] not in ("ctest", "pytest") or len(words) not in (2, 3) or words[2:] not in ([], ["cuda"]):
            sys.exit(f"{path}:{n}: expected `ctest NAME [cuda]` or `pytest PATH [cuda]`, got: {line!r}")
        if words[2:] == ["cuda"] and not cuda:
            continue
        suites.append((words[0], words[1]))
    return suites


def ctest_names(path):
    found = set()
    for test in json.loads(pathlib.Path(path).read_text()).get("tests", []):
        found.add(test["name"])
        if test.get("command"):
            found.add(pathlib.Path(test["command"][0]).name)
    return found


def pytest_files(path):
    return {case.get("file") for case in ET.parse(path).getroot().iter("testcase") if case.get("file")}


def main(argv):
    if len(argv) not in (4, 5) or argv[4:] not in ([], ["--cuda"]):
        sys.exit(__doc__)
    suites = expected(argv[1], cuda=argv[4:] == ["--cuda"])
    in_ctest = ctest_names(argv[2])
    in_pytest = pytest_files(argv[3]) if pathlib.Path(argv[3]).exists() else set()
    missing = [f"{kind} {name}" for kind, name in suites
               if (kind == "ctest" and name not in in_ctest) or (kind == "pytest" and name not in in_pytest)]
    for m in missing:
        print(f"check_suites: MISSING suite: {m}", file=sys.stderr)
    print(f"check_suites: {len(suites) - len(missing)} of {len(suites)} expected suites ran")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
