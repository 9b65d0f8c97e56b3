"""Sum pytest JUnit XML reports into one closing line: `suite: N passed, N failed, N skipped`.

Each argument is one run's report; under MPI the other ranks' reports sit beside it as
REPORT.rankN, and a test counts once, as failed if it failed on any rank. A missing or
unreadable report (a run that died or hung before writing it) counts as a failure.
"""
import glob
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname"), case.get("name"))
        if case.find("failure") is not None or case.find("error") is not None:
            result[key] = "failed"
        elif case.find("skipped") is not None:
            result[key] = "skipped"
        else:
            result[key] = "passed"
    return result


counts = {"passed": 0, "failed": 0, "skipped": 0}
for report in sys.argv[1:]:
    merged = {}
    for path in [report, *sorted(glob.glob(report + ".rank*"))]:
        try:
            found = outcomes(path)
        except (OSError, ET.ParseError):
            print(f"missing test report {path} (the run died or hung before writing it)")
            counts["failed"] += 1
            continue
        for key, status in found.items():
            if status == "failed" or key not in merged:  # a failure on any rank wins
                merged[key] = status
    for status in merged.values():
        counts[status] += 1
print(f"suite: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
sys.exit(1 if counts["failed"] else 0)
