#!/usr/bin/env python3
"""Prints each test ctest skipped and why, from its JUnit file (ctest --output-junit): the
message GoogleTest's GTEST_SKIP gave, or the "skipped: ..." / "SKIP: ..." line a script printed
before exiting 77.

  scripts/ctest_skips.py build/ctest-junit.xml
"""
import sys
import xml.etree.ElementTree as ET


def reason(output: str) -> str:
    lines = [line.strip() for line in output.splitlines()]
    for i, line in enumerate(lines):
        if line.endswith(": Skipped") and i + 1 < len(lines) and lines[i + 1]:
            return lines[i + 1]  # GoogleTest: "file.cpp:12: Skipped" then the message
        if line.lower().startswith(("skipped:", "skip:")):
            return line.split(":", 1)[1].strip() or line
    return "(no reason printed)"


def main() -> int:
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError, IndexError) as e:
        print(f"ctest_skips: cannot read the JUnit file: {e}")
        return 1
    skipped = []
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            out = case.find("system-out")
            skipped.append((case.get("name", "?"), reason(out.text if out is not None and out.text else "")))
    if skipped:
        print(f"skipped tests ({len(skipped)}), and why:")
        for name, why in skipped:
            print(f"  {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
