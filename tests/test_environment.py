"""docs/environment.md is the one description of the environment variables (issue 53): the IMAGEGEN_*
variables the package and its C++ kernel name are those its "Read by imagegen" table lists, the tests' own
(tests/, .ci/) those of "Read by the tests only", and the ones it says became something else appear nowhere."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"IMAGEGEN_[A-Z0-9_]*[A-Z0-9]")


def named(*folders):
    """The IMAGEGEN_* names the files under folders hold (but this one's)."""
    return {m for folder in folders for path in (ROOT / folder).rglob("*") if path.is_file()
            and path.suffix not in (".pyc", ".so", ".o") and path.resolve() != Path(__file__).resolve()
            for m in NAME.findall(path.read_text(errors="ignore"))}


def table(heading):
    """The IMAGEGEN_* names in the first column of the table under `## heading` of docs/environment.md."""
    section = (ROOT / "docs" / "environment.md").read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {m for cell in rows for m in NAME.findall(cell)}


def test_the_package_reads_what_the_page_lists():
    assert named("imagegen", "csrc", "conf") == table("Read by imagegen")


def test_the_tests_read_the_packages_and_their_own():
    assert named("tests", ".ci") - named("imagegen", "csrc", "conf") == table("Read by the tests only")


def test_a_variable_that_became_something_else_is_read_nowhere():
    gone = table("What became of the others")
    assert {"IMAGEGEN_PRECISION_PROBE", "IMAGEGEN_INT8_FORM", "IMAGEGEN_KERNEL_NATIVE"} <= gone
    assert not gone & named("imagegen", "csrc", "conf", "tests", ".ci", "tools")
