"""`itertrace report`: one self-contained page with every section a database can fill, and a browser that renders it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest

from itertrace.cli import main
from itertrace.ingest import ingest

CHROMIUM = shutil.which("chromium")
needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys (Nsight Systems) is not installed")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")

EVERY_SECTION = ("runs", "host-gaps", "timeline", "membership", "slot-time", "active-tokens", "latency", "fairness",
                 "log-vs-trace")
EVERY_TABLE = ("Gaps per track", "Gap time by host phase", "Longest gaps", "Slot-iterations", "Latency summary",
               "Latency by class", "The followed request", "request_latency_compare, summarised")


@pytest.fixture(scope="module")
def simulated_db(tmp_path_factory) -> Path:
    """The worked example on the simulated runner: a run log and no trace."""
    folder = tmp_path_factory.mktemp("simulated")
    assert main(["run", "--runner", "simulated", "--workload", "worked-example", "--mode", "static",
                 "--capacity", "8", "--out", str(folder / "run")]) == 0
    return ingest([folder / "run"], folder / "simulated.duckdb").db


@pytest.fixture(scope="module")
def comparison(sample_dbs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", "--db", str(sample_dbs["static"]), "--db", str(sample_dbs["continuous"]),
                 "-o", str(out), "--quiet"]) == 0
    return out


def section_ids(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', page)


def assert_loads_nothing(page: str) -> None:
    """No script, stylesheet, image or frame comes from elsewhere, and no CDN appears anywhere."""
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=\s*[\"']?(https?:)?//", page, re.I)
    assert not re.search(r"@import|url\(\s*[\"']?https?:", page, re.I)
    for cdn in ("cdn.jsdelivr", "unpkg.com", "cdnjs", "googleapis", "vega.github.io/schema/vega-lite"):
        assert cdn not in page


@needs_nsys
def test_comparison_report_holds_every_section_and_loads_nothing(comparison, sample_dbs):
    page = comparison.read_text()
    assert_loads_nothing(page)
    assert section_ids(page) == list(EVERY_SECTION)
    assert page.count("<script>") == 2 and "window.vegaEmbed" in page  # the inlined bundle, then the embedding
    for title in EVERY_TABLE:
        assert f"<h3>{title}</h3>" in page
    charts = re.findall(r'<div class="chart" id="chart-(\d+)" data-spec="spec-\1" data-name="([^"]+)"', page)
    names = [name for _, name in charts]
    assert names == ["host-gaps-static", "host-gaps-continuous", "timeline-static", "timeline-continuous",
                     "membership-static", "membership-continuous", "slot-time", "active-tokens", "latency-cdf",
                     "fairness-progress"]
    assert all(f'<script type="application/json" id="spec-{i}">' in page for i, _ in charts)
    assert "<title>itertrace report: static vs continuous</title>" in page
    assert "measured" in page and "Simulated:" not in page
    assert [p.name for p in comparison.parent.iterdir()] == ["report.html"]  # no temporary file left


def test_simulated_run_report_says_so_and_leaves_out_the_gap_charts(simulated_db, tmp_path):
    out = tmp_path / "sim.html"
    assert main(["report", "--db", str(simulated_db), "-o", str(out), "--quiet"]) == 0
    page = out.read_text()
    assert_loads_nothing(page)
    assert section_ids(page) == ["runs", "host-gaps", "membership", "slot-time", "active-tokens", "latency",
                                 "fairness"]
    assert "SIMULATED: cost model" in page and 'class="simulated">Simulated:' in page
    gaps = page.split('<section id="host-gaps">')[1].split("</section>")[0]
    assert "no Nsight Systems trace" in gaps and 'class="chart"' not in gaps


@pytest.mark.slow
def test_png_option_writes_every_chart(simulated_db, tmp_path):
    out, pngs = tmp_path / "r.html", tmp_path / "png"
    assert main(["report", "--db", str(simulated_db), "-o", str(out), "--png", str(pngs), "--quiet"]) == 0
    written = sorted(p.name for p in pngs.iterdir())
    assert written == ["01-membership.png", "02-slot-time.png", "03-active-tokens.png", "04-latency-cdf.png",
                       "05-fairness-progress.png"]
    assert all((pngs / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in written)
    assert out.read_text().count('class="chart"') == len(written)


def fails(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itertrace: error: "), captured.err
    return lines[0]


def test_bad_input_is_one_line_and_leaves_the_earlier_page(simulated_db, tmp_path, capsys):
    out = tmp_path / "report.html"
    earlier = '<!DOCTYPE html>\n<p class="meta">Made by itertrace: an earlier report</p>'  # -o replaces only a report
    out.write_text(earlier)
    missing = tmp_path / "nope.duckdb"
    assert str(missing) in fails(capsys, "report", "--db", str(missing), "-o", str(out))
    assert "--nope" in fails(capsys, "report", "--db", str(simulated_db), "-o", str(out), "--nope")
    assert "one label per database" in fails(capsys, "report", "--db", str(simulated_db), "--label", "a",
                                             "--label", "b", "-o", str(out))
    assert "does not exist" in fails(capsys, "report", "--db", str(simulated_db), "-o", str(tmp_path / "x" / "r.html"))
    assert "is a folder" in fails(capsys, "report", "--db", str(simulated_db), "-o", str(tmp_path))
    not_db = tmp_path / "text.duckdb"
    not_db.write_text("not a database")
    assert str(not_db) in fails(capsys, "report", "--db", str(not_db), "-o", str(out))
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    assert f"{empty}: no table of `itertrace ingest`" in fails(capsys, "report", "--db", str(empty), "-o", str(out))
    kept = tmp_path / "kept.duckdb"
    shutil.copy(simulated_db, kept)
    assert "is one of the --db databases" in fails(capsys, "report", "--db", str(kept), "-o", str(kept))
    assert kept.read_bytes() == simulated_db.read_bytes()
    assert out.read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.duckdb", "kept.duckdb", "report.html", "text.duckdb"]


class _Charts(HTMLParser):
    """For each chart container, whether an <svg> or <canvas> lies inside it after the page's scripts ran."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn: dict[str, bool] = {}
        self.rendered: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self._open: str | None = None
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        if self._open is not None:
            self._depth += tag == "div"
            if tag in ("svg", "canvas"):
                self.drawn[self._open] = True
        elif tag == "div" and "data-spec" in attrs:
            self._open, self._depth = attrs["id"], 1
            self.drawn[self._open] = False
            self.rendered[self._open] = attrs.get("data-rendered", "")

    def handle_endtag(self, tag):
        if self._open is not None and tag == "div":
            self._depth -= 1
            if self._depth == 0:
                self._open = None


def offline_chromium(*args: str, profile: Path) -> list[str]:
    """Chromium headless with no network: in a network namespace of its own where it may, and no proxy or DNS."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
               "--enable-logging=stderr", "--v=0", *args]
    unshare = shutil.which("unshare")
    if os.geteuid() == 0 and unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        command = [unshare, "-n", *command]
    return command


@pytest.fixture(scope="module")
def browsable(request, simulated_db, tmp_path_factory) -> Path:
    """A report to open in a browser: the samples' comparison where nsys is here, else the simulated run's."""
    if shutil.which("nsys") is not None:
        return request.getfixturevalue("comparison")
    out = tmp_path_factory.mktemp("browsable") / "report.html"
    assert main(["report", "--db", str(simulated_db), "-o", str(out), "--quiet"]) == 0
    return out


@needs_chromium
@pytest.mark.slow
def test_every_chart_renders_in_chromium_without_a_network(browsable, tmp_path):
    charts = browsable.read_text().count('<div class="chart"')
    assert charts >= 5
    result = subprocess.run(
        offline_chromium("--virtual-time-budget=30000", "--dump-dom", browsable.as_uri(), profile=tmp_path / "profile"),
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    parser = _Charts()
    parser.feed(result.stdout)
    assert len(parser.drawn) == charts
    assert parser.rendered == {chart: "yes" for chart in parser.drawn}, parser.rendered
    assert all(parser.drawn.values()), parser.drawn  # an <svg> inside every chart
    assert parser.body.get("data-charts") == "done"
    page_console = [line for line in result.stderr.splitlines() if "CONSOLE" in line and "file://" in line]
    assert page_console == []  # the page logs nothing: no errors, no warnings


def test_report_takes_the_generic_mapping_for_another_programs_trace(sample_dbs, tmp_path, capsys):
    out = tmp_path / "generic.html"
    params = ["--param", "preset=generic", "--param", "step_pattern=^step$", "--param", "device_pattern=^forward$"]
    assert main(["report", "--db", str(sample_dbs["static"]), "-o", str(out), "--quiet", *params]) == 0
    assert "Host gaps between device iterations" in out.read_text()
    missing = tmp_path / "missing.html"
    assert main(["report", "--db", str(sample_dbs["static"]), "-o", str(missing), "--param", "preset=generic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parameter step_pattern is missing" in err[0] and not missing.exists()


def test_png_option_replaces_only_pngs(simulated_db, tmp_path):
    """--png replaces a chart's PNG, never another file of that name, and checks every name before it writes."""
    out, pngs = tmp_path / "r.html", tmp_path / "png"
    pngs.mkdir()
    (pngs / "03-active-tokens.png").write_text("my notes, saved under an unlucky name\n")
    done = subprocess.run([sys.executable, "-m", "itertrace.cli", "report", "--db", str(simulated_db), "-o", str(out),
                           "--png", str(pngs), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "holds something other than a PNG" in done.stderr
    assert sorted(p.name for p in pngs.iterdir()) == ["03-active-tokens.png"] and not out.exists()
    (pngs / "03-active-tokens.png").unlink()
    for _ in range(2):  # its own PNGs, written again
        assert main(["report", "--db", str(simulated_db), "-o", str(out), "--png", str(pngs), "--quiet"]) == 0
    assert len(list(pngs.iterdir())) == 5
