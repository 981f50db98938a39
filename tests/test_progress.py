"""ui/progress.py: the terminal progress of `mixgraph run` and `demo` counts sampler steps."""

import io

from mixgraph.graph import events as ev
from mixgraph.ui.progress import ProgressBar


def test_progress_bar_counts_sampler_steps_with_time_left():
    out = io.StringIO()
    bar = ProgressBar(file=out)
    bar(ev.ExecutionStart("p", planned=("4", "3", "8")))
    bar(ev.Executing("p", node="4", class_type="CheckpointLoaderSimple"))
    bar(ev.Executing("p", node="3", class_type="KSampler"))
    for i in range(1, 6):
        bar(ev.Progress("p", node="3", value=i, max=5))
    bar(ev.Warning("p", message="careful"))
    bar(ev.Executing("p", node="8", class_type="VAEDecode"))
    bar(ev.Executing("p", node=None))
    bar.close()
    text = out.getvalue()
    assert "KSampler (node 3)" in text and "[2/3]" in text
    assert "5/5 steps" in text and "<" in text  # elapsed<remaining
    assert "warning: careful" in text


def test_progress_bar_disabled_prints_only_warnings():
    out = io.StringIO()
    bar = ProgressBar(disable=True, file=out)
    bar(ev.ExecutionStart("p", planned=("3",)))
    bar(ev.Executing("p", node="3", class_type="KSampler"))
    bar(ev.Progress("p", node="3", value=1, max=2))
    bar(ev.NanFallback("p", message="re-ran in f32"))
    bar.close()
    assert out.getvalue() == "warning: re-ran in f32\n"
