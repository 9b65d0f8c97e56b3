"""Sum pytest JUnit XML reports into one closing line: `suite: N passed, N failed, N skipped`.
A missing or unreadable report (a run that died before writing it) counts as a failure."""
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        suites = ET.parse(path).getroot().iter("testsuite")
    except (OSError, ET.ParseError):
        print(f"missing test report {path} (the run died before writing it)")
        failed += 1
        continue
    for s in suites:
        tests, fails = int(s.get("tests", 0)), int(s.get("failures", 0)) + int(s.get("errors", 0))
        skips = int(s.get("skipped", 0))
        passed += tests - fails - skips
        failed += fails
        skipped += skips
print(f"suite: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
