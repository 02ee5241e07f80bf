"""The README stays short and its links resolve; the reference in docs/ builds strictly and names modules once."""
import re
import shutil
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MODULE_PATH = re.compile(r"\b(?:adapter|fhir_transforms|text_deid)/[\w/]*\.py\b")


def _relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_is_at_most_200_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "deid-adapter fhir examples/fhir examples/output --key-file examples/demo.key" in text
    assert "\nscripts/run-tests.sh\n" in text


def test_every_relative_link_in_readme_resolves():
    links = _relative_links(README.read_text(encoding="utf-8"))
    assert links, "the README links into docs/"
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).is_file()]
    assert not missing


def test_module_paths_are_named_on_the_layout_page_only():
    pages = [README, *sorted(DOCS.glob("*.md"))]
    named = {p.name: sorted(set(MODULE_PATH.findall(p.read_text(encoding="utf-8")))) for p in pages
             if p.name != "layout.md"}
    assert {name: paths for name, paths in named.items() if paths} == {}
    assert MODULE_PATH.search((DOCS / "layout.md").read_text(encoding="utf-8"))


def _build(docs_root: Path, site: Path) -> subprocess.CompletedProcess:
    # Not -q: quiet mode hides the warnings that --strict counts.
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=docs_root, capture_output=True, text=True, timeout=120)


def test_strict_build_fails_on_a_broken_link(tmp_path):
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(DOCS, copy / "docs")
    assert _build(copy, tmp_path / "site-ok").returncode == 0

    page = copy / "docs" / "risk.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [nothing](no-such-page.md).\n", encoding="utf-8")
    broken = _build(copy, tmp_path / "site-broken")
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stdout + broken.stderr
