"""The browser calculator (docs/_static/memory_widget.js) is the Python memory model, number for
number.

One truth: the widget's JavaScript port of :mod:`guide.memory.fit` runs in headless Chromium (the
distribution's, via Playwright, as in ``tests/test_site.py``) on :data:`CHECKED_CONFIGS`
configurations (every preset x precision x optimizer x checkpointing, then random shapes; N from 1
to 4,096, GPU presets and typed sizes, HSDP shard groups that do and do not divide N), and every
number it computes is compared, as an exact integer, with ``guide-memory --json`` (the command's
``main``, in process). The guard names the first configuration that differs, and a test proves it
does when one formula of the port is changed. Then the widget is driven like a reader: typing,
selecting, reading the table, sharing the URL, bad input, a phone's width, the keyboard and the
dark theme.

These tests serve docs/_static directly (``file://``): no docs build needed. They are
``test_browser_*``: the ``browser`` nox session runs them (``GUIDE_SITE_TESTS=browser``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import random
import time
from pathlib import Path

import pytest

from guide.memory import PRESETS, PRECISIONS
from guide.memory.activations import CHECKPOINTING
from guide.memory.cli import format_bytes, main
from guide.memory.display import smallest_text
from guide.memory.fit import GPU_BYTES
from guide.memory.widget import CHECKED_CONFIGS, WIDGET_JS
from guide.optimizers import OPTIMIZERS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "_build" / "screenshots"
#: Fields of each row of ``--cpu-offload`` (the JSON's ``cpu_offload``) compared.
OFFLOAD_FIELDS = ("N", "gpu_without", "gpu_saved", "gpu_with", "host", "to_device", "to_host")
#: Fields of each row compared, besides the configuration-wide ones.
ROW_FIELDS = ("label", "shard_group", "params", "unsharded", "grads", "optimizer", "buckets",
              "activations", "autocast", "buffers", "total", "fits", "headroom")

#: A page that holds one calculator and, for the theme test, pydata-sphinx-theme's variables.
HARNESS = """<!doctype html><html lang="en" data-theme="{theme}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>calculator</title>
<style>html[data-theme=dark]{{--pst-color-text-base:#cecece;--pst-color-background:#14181e;
--pst-color-surface:#29313d;--pst-color-border:#48566b}} body{{margin:8px;font-family:sans-serif;
background:var(--pst-color-background,#fff)}}</style></head>
<body><div class="memory-widget" data-widget="{mode}"></div>
<script src="{js}"></script></body></html>
"""


# -- the configurations and the two models -------------------------------------------------------

def configurations(count: int = CHECKED_CONFIGS, seed: int = 2026) -> list[dict]:
    """Every preset x precision x optimizer x checkpointing, then random shapes, up to ``count``;
    the first two take N = 1 and N = 4,096. Each also draws guide-memory's three switches
    (``--unfused-attention``, ``--bucket-view``, the analytic ``zero2`` strategy) from a second
    generator, and ``--cpu-offload`` (shapes only: the command refuses it for a parameter count)
    from a third, so the draws above are the ones they always were."""
    rng, switches = random.Random(seed), random.Random(seed + 1)
    offload = random.Random(seed + 2)
    gpus = list(GPU_BYTES)

    def common(cfg: dict, max_seq: int | None) -> dict:
        top = min(max_seq or 32768, 32768)
        n = rng.choice([rng.randint(1, 4096), 2 ** rng.randint(0, 12), 8 * rng.randint(1, 512)])
        gpu = rng.choice([*gpus, None])
        out = {**cfg, "seq_len": rng.randint(1, top), "micro_batch": rng.randint(1, 8),
               "world_sizes": [n], "shard_group": rng.choice([1, 2, 4, 6, 8, 8, 16]),
               "strategies": ["ddp", "zero1", "fsdp2_no_reshard", "fsdp2", "hsdp"],
               **({"gpu": gpu} if gpu else
                  {"gib": str(round(rng.uniform(4, 200), rng.randint(0, 3)))})}
        out["unfused_attention"] = switches.random() < 0.5
        out["bucket_view"] = switches.random() < 0.5
        if switches.random() < 0.5:
            out["strategies"] = [*out["strategies"], "zero2"]
        out["cpu_offload"] = offload.random() < 0.5 and "params" not in cfg
        return out

    out = []
    for preset, arch in PRESETS.items():
        for precision in PRECISIONS:
            for optimizer in OPTIMIZERS:
                for ckpt in CHECKPOINTING:
                    out.append(common({"preset": preset, "precision": precision,
                                       "optimizer": optimizer, "checkpointing": ckpt},
                                      arch.max_seq_len))
    params_alone = 0
    while len(out) < count:
        # a parameter count alone (no shapes, no activations): at least 10 of them, then 1 in 8
        if params_alone < 10 or len(out) % 8 == 0:
            params = rng.choice([rng.randint(1, 10**13), 2**rng.randint(0, 50)])
            out.append(common({"params": params,
                               "precision": rng.choice(list(PRECISIONS)),
                               "optimizer": rng.choice(list(OPTIMIZERS)),
                               "checkpointing": "none"}, None))
            params_alone += 1
            continue
        heads = rng.choice([1, 2, 3, 4, 8, 12, 16, 25, 32, 40, 64])
        kv = rng.choice([None, *[d for d in range(1, heads + 1) if heads % d == 0]])
        out.append(common({"hidden": heads * rng.choice([8, 16, 24, 64, 80, 128]),
                           "heads": heads, "kv_heads": kv, "layers": rng.randint(1, 96),
                           "vocab": rng.randint(2, 260_000), "mlp": rng.randint(1, 50_000),
                           "tied": rng.random() < 0.5,
                           "precision": rng.choice(list(PRECISIONS)),
                           "optimizer": rng.choice(list(OPTIMIZERS)),
                           "checkpointing": rng.choice(CHECKPOINTING)}, None))
    out[0]["world_sizes"], out[1]["world_sizes"] = [1], [4096]
    return out[:count]


def assert_switches_drawn(cfgs: list[dict]) -> None:
    """The configurations take guide-memory's switches both ways: attention fused and
    unfused (on shapes, where activations are priced), DDP's buckets kept and dropped, the
    paper's ZeRO-2 asked for and not, FSDP2's CPU offload on and off (on shapes)."""
    shaped = [c for c in cfgs if "params" not in c]
    assert {c["unfused_attention"] for c in shaped} == {False, True}
    assert {c["cpu_offload"] for c in shaped} == {False, True}
    assert not any(c["cpu_offload"] for c in cfgs if "params" in c)
    assert {c["bucket_view"] for c in cfgs} == {False, True}
    assert {"zero2" in c["strategies"] for c in cfgs} == {False, True}
    counted = [c for c in cfgs if "params" in c]  # from configuration #288 on
    assert not counted or any("zero2" in c["strategies"] for c in counted)


def python_report(cfg: dict) -> dict:
    """``guide-memory --json`` for ``cfg``: the command's own output, parsed."""
    argv = (["--preset", cfg["preset"]] if "preset" in cfg else
            ["--params", str(cfg["params"])] if "params" in cfg else
            ["--hidden", str(cfg["hidden"]), "--vocab", str(cfg["vocab"]), "--layers",
             str(cfg["layers"]), "--heads", str(cfg["heads"]), "--mlp", str(cfg["mlp"]),
             *(["--kv-heads", str(cfg["kv_heads"])] if cfg["kv_heads"] else []),
             *(["--tied"] if cfg["tied"] else [])])
    argv += ["--precision", cfg["precision"], "--optimizer", cfg["optimizer"],
             "--strategy", *cfg["strategies"], "-N", *map(str, cfg["world_sizes"]),
             *([] if "params" in cfg else
               ["--seq-len", str(cfg["seq_len"]), "--micro-batch", str(cfg["micro_batch"]),
                "--activation-checkpointing", cfg["checkpointing"]]),
             "--shard-group", str(cfg["shard_group"]),
             *(["--unfused-attention"] if cfg.get("unfused_attention") else []),
             *(["--bucket-view"] if cfg.get("bucket_view") else []),
             *(["--cpu-offload"] if cfg.get("cpu_offload") else []),
             *(["--gpu", cfg["gpu"]] if "gpu" in cfg else ["--gpu-memory", cfg["gib"]]), "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0, argv
    return json.loads(out.getvalue())


@functools.cache
def _python(i: int) -> dict:
    """guide-memory's report of configuration ``i``, computed once per session."""
    return python_report(configurations()[i])


def _reports(count: int = CHECKED_CONFIGS) -> tuple[list[dict], list[dict]]:
    """The first ``count`` configurations and guide-memory's report of each."""
    return _reports_at(range(count))


def _reports_at(indices) -> tuple[list[dict], list[dict]]:
    """The configurations at ``indices`` (of :func:`configurations`) and guide-memory's report
    of each."""
    cfgs = configurations()
    return [cfgs[i] for i in indices], [_python(i) for i in indices]


_JS_REPORTS = """cfgs => cfgs.map(c => {
  try {
    const cfg = Object.assign({}, c, c.gib === undefined ? {} : {gib: Number(c.gib)});
    return JSON.parse(JSON.stringify(MemoryWidget.model.fitReport(cfg),
                      (k, v) => typeof v === "bigint" ? v.toString() : v));
  } catch (e) { return {error: String(e && e.stack || e)}; }
})"""


def _text(v):
    return v if v is None or isinstance(v, (bool, str)) else str(v)


def compare(cfgs: list[dict], js: list[dict], py: list[dict],
            numbers=None) -> tuple[str | None, int, int]:
    """(the first difference, naming its configuration (its number in ``numbers``, else its
    place in ``cfgs``), or None; numbers compared; the largest absolute difference between two
    numbers that both models gave)."""
    compared, largest, first = 0, 0, None
    numbers = list(range(len(cfgs))) if numbers is None else list(numbers)

    def same(i: int, what: str, a, b) -> None:
        nonlocal compared, largest, first
        compared += 1
        a, b = _text(a), _text(b)
        if isinstance(a, str) and isinstance(b, str) and a.lstrip("-").isdigit() \
                and b.lstrip("-").isdigit():
            largest = max(largest, abs(int(a) - int(b)))
        if a != b and first is None:
            first = (f"configuration #{numbers[i]} {json.dumps(cfgs[i], sort_keys=True)}: {what}: "
                     f"the widget gives {a!r}, guide-memory --json {b!r}")

    for i, (j, p) in enumerate(zip(js, py, strict=True)):
        if "error" in j:
            same(i, "the widget raised", j["error"], None)
            continue
        same(i, "parameters", j["parameters"], p["parameters"])
        same(i, "capacity", j["capacity"], p["capacity"])
        same(i, "activations", j["activations"], p["rows"][0]["activations"])
        same(i, "ddp_buckets", j["ddp_buckets"], p["ddp_buckets"])
        same(i, "attention", j["attention"], p["activations"] and p["activations"]["attention"])
        for key, n in p["smallest_world_size"].items():
            same(i, f"smallest N for {key}", j["smallest_world_size"].get(key), n)
        same(i, "rows", len(j["rows"]), len(p["rows"]))
        for jr, pr in zip(j["rows"], p["rows"]):
            for field in ROW_FIELDS:
                same(i, f"{pr['strategy']} at N={pr['N']}: {field}", jr.get(field), pr[field])
        same(i, "cpu_offload", "cpu_offload" in j, "cpu_offload" in p)
        if "cpu_offload" in j and "cpu_offload" in p:
            jo, po = j["cpu_offload"], p["cpu_offload"]
            same(i, "cpu_offload: estimate", jo.get("estimate"), po["estimate"])
            same(i, "cpu_offload: rows", len(jo["rows"]), len(po["rows"]))
            for jr, pr in zip(jo["rows"], po["rows"]):
                same(i, f"cpu_offload at N={pr['N']}: fields", sorted(jr), sorted(pr))
                for field in OFFLOAD_FIELDS:
                    same(i, f"cpu_offload at N={pr['N']}: {field}", jr.get(field), pr[field])
    return first, compared, largest


# -- the browser ---------------------------------------------------------------------------------

@contextlib.contextmanager
def widget_page(tmp_path: Path, mode: str = "full", theme: str = "light",
                viewport: dict = DESKTOP, query: str = ""):
    """A page holding the widget, in headless Chromium; anything but file:// is blocked (the
    widget must not need the network). Yields (page, console errors, seconds to first result)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: install it with `apt-get install -y chromium`.")
    playwright = pytest.importorskip("playwright.sync_api")
    tmp_path.mkdir(parents=True, exist_ok=True)
    html = tmp_path / f"{mode}-{theme}.html"
    html.write_text(HARNESS.format(mode=mode, theme=theme, js=WIDGET_JS.as_uri()))
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport=viewport)
        context.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith("file://") else route.abort())
        try:
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            started = time.monotonic()
            page.goto(html.as_uri() + query, wait_until="load")
            page.wait_for_selector(".memory-widget .mw-out table, .memory-widget .mw-errors p")
            yield page, errors, time.monotonic() - started
        finally:
            context.close()


def _js_reports(page, cfgs: list[dict]) -> list[dict]:
    return page.evaluate(_JS_REPORTS, cfgs)


@pytest.mark.timeout(1200)  # 320 reports of guide-memory: about 100 s on 2 loaded cores
def test_browser_widget_equals_the_python_model_to_the_byte(tmp_path):
    cfgs, py = _reports()
    assert len(cfgs) >= 300
    presets = {c.get("preset") for c in cfgs}
    assert sum("params" in c for c in cfgs) >= 10  # parameter counts alone, too
    assert set(PRESETS) <= presets and {c["precision"] for c in cfgs} == set(PRECISIONS)
    assert {c["optimizer"] for c in cfgs} == set(OPTIMIZERS)
    assert {c["checkpointing"] for c in cfgs} == set(CHECKPOINTING)
    assert_switches_drawn(cfgs)
    assert {1, 4096} <= {c["world_sizes"][0] for c in cfgs}
    assert any(c["world_sizes"][0] % c["shard_group"] and c["world_sizes"][0] > c["shard_group"]
               for c in cfgs)  # HSDP's "no such mesh" is compared too
    with widget_page(tmp_path) as (page, errors, seconds):
        started = time.monotonic()
        js = _js_reports(page, cfgs)
        js_seconds = time.monotonic() - started
    first, compared, largest = compare(cfgs, js, py)
    print(f"\n{len(cfgs)} configurations, {compared:,} numbers compared, largest difference "
          f"{largest}; widget {WIDGET_JS.stat().st_size:,} bytes, first result {seconds:.2f} s "
          f"after navigation, {len(cfgs)} reports in {js_seconds:.1f} s")
    assert first is None, first
    assert largest == 0 and compared >= 59 * len(cfgs)  # 5 rows x 10, 5 smallest N, 4 more
    assert errors == []


@pytest.mark.parametrize(("patch", "names"), [
    # one formula changed in the port: the unsharded copy loses its padding
    ("M.unshardedParamBytes = (s, n, p) => { let t = 0n; for (const x of s) t += M.numel(x); "
     "return t * BigInt(MemoryWidget.data.precisions[p].compute); }", "unsharded"),
    # one block's saved bytes 1/34 larger (as Korthikanti's 34 becoming 35 once did)
    ("const k = M.blockBytes; M.blockBytes = (a, s, b, e) => k(a, s, b, e) / 34n * 35n;",
     "activations"),
    # ZeRO-1's greedy partition hands out the *smallest* parameters first
    ("M.zero1Partition = (shapes, n) => { const z = shapes.map(s => Number(M.numel(s))); "
     "const held = new Array(n).fill(0), own = Array.from({length: n}, () => []); "
     "z.map((_, i) => i).sort((i, j) => z[i] - z[j]).forEach(i => { let r = 0; "
     "for (let q = 1; q < n; q++) if (held[q] < held[r]) r = q; own[r].push(i); "
     "held[r] += z[i]; }); return own; }", "zero1"),
])
@pytest.mark.timeout(600)
def test_browser_guard_names_the_configuration_when_a_formula_changes(tmp_path, patch, names):
    cfgs, py = _reports(60)
    with widget_page(tmp_path) as (page, errors, _):
        assert compare(cfgs, _js_reports(page, cfgs), py)[0] is None
        page.evaluate(f"() => {{ const M = MemoryWidget.model; {patch} }}")
        first, _, largest = compare(cfgs, _js_reports(page, cfgs), py)
    assert first is not None and first.startswith("configuration #") and names in first, first
    assert largest > 0


def _cell(page, strategy: str, part: str) -> str:
    return page.locator(f'.memory-widget tr[data-strategy="{strategy}"] '
                        f'[data-part="{part}"]').inner_text()


def test_browser_widget_driven_like_a_user(tmp_path):
    """Select a model and a GPU, type N and a sequence length, read the table; the URL carries
    the inputs (in its query string), and opening it again shows the same result."""
    with widget_page(tmp_path) as (page, errors, _):
        page.get_by_label("Model").select_option("llama-3-70b")
        page.get_by_label("GPU", exact=True).select_option("H200 (141 GB)")
        n = page.get_by_label("Number of GPUs (N)")
        n.fill("")
        n.press_sequentially("64")
        page.get_by_label("Sequence length (tokens)").fill("2048")
        page.get_by_label("Activation checkpointing").select_option("full")
        want = python_report({"preset": "llama-3-70b", "precision": "bf16_mixed",
                              "optimizer": "adamw", "checkpointing": "full", "seq_len": 2048,
                              "micro_batch": 1, "world_sizes": [64], "shard_group": 8,
                              "gpu": "H200 (141 GB)",
                              "strategies": ["ddp", "zero1", "fsdp2_no_reshard", "fsdp2",
                                             "hsdp"]})
        for row in want["rows"]:
            assert _cell(page, row["strategy"], "total") == format_bytes(row["total"])
            assert _cell(page, row["strategy"], "fits") == ("yes" if row["fits"] else "no")
            small = want["smallest_world_size"][row["strategy"]]
            assert _cell(page, row["strategy"], "smallest") == smallest_text(small, 4096)
        assert page.locator(".memory-widget svg rect").count() >= 10  # the bar chart
        url = page.evaluate("location.href")
        assert "?" in url and "#" not in url
        assert "world_size=64" in url and "preset=llama-3-70b" in url
        assert "checkpointing=full" in url
        shown = page.locator(".memory-widget table").inner_text()
        page.goto("about:blank")
        page.goto(url)
        page.wait_for_selector(".memory-widget table")
        assert page.locator(".memory-widget table").inner_text() == shown
        assert page.get_by_label("Number of GPUs (N)").input_value() == "64"
        # the keyboard: every control has a label, and Tab walks them in the form's order
        labelled = page.evaluate("""() => Array.from(document.querySelectorAll(
            '.memory-widget input, .memory-widget select')).every(i => i.labels.length === 1)""")
        assert labelled
        page.get_by_label("Model").focus()
        order = []
        for _ in range(4):
            page.keyboard.press("Tab")
            order.append(page.evaluate("document.activeElement.name"))
        assert order == ["precision", "optimizer", "seq_len", "micro_batch"], order
        page.keyboard.press("Shift+Tab")  # back to the sequence length; typing edits it
        page.keyboard.press("End")
        page.keyboard.type("3")
        assert page.get_by_label("Sequence length (tokens)").input_value() == "20483"
    assert errors == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("Number of GPUs (N)", "-8", "Number of GPUs must be at least 1, got -8."),
    ("Number of GPUs (N)", "0", "Number of GPUs must be at least 1, got 0."),
    ("Number of GPUs (N)", "2.5", "Number of GPUs must be a whole number, got 2.5."),
    ("Micro-batch (sequences per GPU)", "two", 'Micro-batch: "two" is not a number'),
    ("Sequence length (tokens)", "", "Sequence length: enter a whole number (it is empty)."),
    ("Sequence length (tokens)", "9000", "Sequence length 9,000 is longer than llama-3-8b "
                                         "supports (8,192 positions)"),
    ("Attention heads", "30", "Attention heads (30) must divide the hidden size (4096)"),
    ("KV heads (blank: = heads)", "5", "KV heads (5) must divide the attention heads (32)."),
    ("Hidden size", "-1", "Hidden size must be at least 1, got -1."),
    ("GPU memory (GiB)", "-80",
     'GPU memory must be a positive number of GiB, such as 80; got "-80"'),
])
def test_browser_bad_input_gets_a_clear_message(tmp_path, field, value, message):
    with widget_page(tmp_path) as (page, errors, _):
        if field in ("Attention heads", "KV heads (blank: = heads)", "Hidden size"):
            page.get_by_label("Model").select_option("custom")
        if field == "GPU memory (GiB)":
            page.get_by_label("GPU", exact=True).select_option("custom")
        page.get_by_label(field).fill(value)
        alert = page.locator(".memory-widget [role=alert]").inner_text()
        text = page.locator(".memory-widget").inner_text()
        assert message in alert, alert
        assert "NaN" not in text and "undefined" not in text and "Infinity" not in text
        assert "No result until the form is corrected" in text
        if not field.startswith("KV heads"):  # blank KV heads means "= heads": no error
            page.get_by_label(field).fill("")  # an empty field is named, never a blank result
            assert page.locator(".memory-widget [role=alert]").inner_text().strip()
    assert errors == []


def test_browser_widget_fits_a_phone_in_both_themes_and_the_compact_form(tmp_path):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    colours = {}
    for theme in ("light", "dark"):
        for mode in ("full", "compact"):
            with widget_page(tmp_path / f"{theme}-{mode}", mode=mode, theme=theme,
                             viewport=PHONE) as (page, errors, _):
                wide = page.evaluate("""() => ({doc: document.documentElement.scrollWidth,
                    widget: document.querySelector('.memory-widget')
                                    .getBoundingClientRect().right})""")
                assert wide["doc"] <= PHONE["width"] and wide["widget"] <= PHONE["width"], wide
                colours[theme] = page.evaluate("getComputedStyle(document.querySelector("
                                               "'.memory-widget')).color")
                page.screenshot(path=str(SCREENSHOTS / f"widget-{mode}-{theme}-390.png"),
                                full_page=True)
                if mode == "compact":
                    link = page.locator(".memory-widget a.mw-share")
                    assert "world_size=8" in link.get_attribute("href")
                    assert page.locator(".memory-widget select").count() == 2
                assert errors == []
    assert colours["dark"] == "rgb(206, 206, 206)" and colours["light"] != colours["dark"]


@pytest.mark.parametrize(("query", "message"), [
    ("?preset=unknown-model", 'unknown model "unknown-model"; choose one of gpt2-xl, '),
    ("?precision=fp64", 'unknown precision "fp64"; choose one of fp32, bf16_mixed, bf16, '
                        "zero_mixed."),
    ("?world_size=100000000", "Number of GPUs must be at most 16,384, got 100000000."),
    ("?attention=flash", 'unknown attention "flash"; choose one of fused, unfused.'),
    ("?bucket_view=yes", 'unknown gradient_as_bucket_view "yes"; choose one of false, true.'),
    ("?cpu_offload=yes", 'unknown CPU offload "yes"; choose one of false, true.'),
])
def test_browser_a_bad_shared_link_is_named_not_replaced(tmp_path, query, message):
    """A link with an unknown model gets no other model's numbers: the message names the value
    and the options, and the numbers come back once the reader chooses."""
    with widget_page(tmp_path, query=query) as (page, errors, _):
        alert = page.locator(".memory-widget [role=alert]").inner_text()
        assert message in alert, alert
        assert page.locator(".memory-widget table").count() == 0
        text = page.locator(".memory-widget").inner_text()
        assert "No result until the form is corrected" in text
        if "world_size" not in query:
            page.get_by_label("Number of GPUs (N)").fill("16")  # any edit: the defaults stand
            page.wait_for_selector(".memory-widget table")
            assert page.locator(".memory-widget [role=alert]").inner_text().strip() == ""
    assert errors == []


def test_browser_compact_form_states_what_it_assumes(tmp_path):
    """The landing page's form answers with the precision, optimizer, checkpointing, sequence
    length and micro-batch it assumed: guide-memory's first line."""
    with widget_page(tmp_path, mode="compact") as (page, errors, _):
        text = page.locator(".memory-widget .mw-assumptions").inner_text()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["--preset", "llama-3-8b", "--seq-len", "4096", "-N", "8"])
        assert text == out.getvalue().splitlines()[0] + ". Change them in the full calculator."
        assert "bf16_mixed" in text and "AdamW" in text and "none checkpointing" in text
        assert "1 x 4,096 tokens" in text
        smallest = page.locator('.memory-widget [data-part="smallest"]').all_inner_texts()
        assert all(t.isdigit() or t == "no N ≤ 4,096 GPUs" for t in smallest), smallest
    assert errors == []


def test_browser_lora_rank_is_an_input(tmp_path):
    with widget_page(tmp_path) as (page, errors, _):
        page.get_by_label("LoRA rank (blank: train everything)").fill("16")
        page.wait_for_selector(".memory-widget .mw-lora")
        text = page.locator(".memory-widget .mw-lora").inner_text()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["--preset", "llama-3-8b", "-N", "8", "--lora-rank", "16", "--json"])
        total = json.loads(out.getvalue())["lora"]["rows"][0]["total"]
        assert text.startswith("FSDP2, LoRA rank 16 on every linear, base frozen in bf16: "
                               f"{format_bytes(total)} on rank 0 at N = 8 "), text
        assert "lora_rank=16" in page.evaluate("location.href")
    assert errors == []


def test_browser_cpu_offload_is_an_input(tmp_path):
    """Turn FSDP2's CPU offload on: the widget adds guide-memory --cpu-offload's numbers, each
    as the command prints it, and the link carries the choice."""
    with widget_page(tmp_path) as (page, errors, _):
        assert page.locator(".memory-widget table.mw-offload").count() == 0
        page.get_by_label("FSDP2 CPU offload").select_option("true")
        page.wait_for_selector(".memory-widget table.mw-offload")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["--preset", "llama-3-8b", "-N", "8", "--seq-len", "4096", "--cpu-offload",
                  "--json"])
        (row,) = json.loads(out.getvalue())["cpu_offload"]["rows"]
        for part in ("gpu_without", "gpu_saved", "gpu_with", "host", "to_device", "to_host"):
            cell = page.locator(f'.memory-widget table.mw-offload [data-part="{part}"]')
            assert cell.inner_text() == format_bytes(row[part]), part
        assert "cpu_offload=true" in page.evaluate("location.href")
    assert errors == []
