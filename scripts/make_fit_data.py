"""Derive the demo critic's fit data (sample_data/critic_fit/) from the full upstream files.

Kept apart from the demo's audited sample (sample_data/selection.json): FireAct, every gpt-3.5
trajectory not in the sample (one per question); tau-bench airline, every trial (4) of each of the 32
tasks none of whose trials is in the sample (128 trajectories), so no task is on both sides.

Reflexion's ReAct log (noahshinn/reflexion ``hotpotqa_runs/root/ReAct/base/100_questions_5_trials.txt``,
a ReAct agent with the Wikipedia API on 100 HotpotQA questions, 5 trials): trials 2-5 re-list trial 1's
34 correct runs unchanged and rerun its failures, which fail again (mostly with the same text), so only
trial 1 is taken, one run per question (a run listed under both INCORRECT and HALTED is taken once, as
failed), minus the questions that are also in the FireAct fit file (one question, one source) and any
question of the demo sample (matched by normalised text; none is). Entries are copied line for line
into a log of the same format (one ``BEGIN TRIAL 1`` block), which ``critic-audit`` reads as it reads
the upstream log. Its file name sorts after ``tau_airline_fit``: the held-out split shuffles the
sources in sorted order from one seed, so adding it leaves the tau-bench and FireAct split unchanged.

    python scripts/make_fit_data.py ../shared/data sample_data/critic_fit
"""

import json
import re
import sys
from pathlib import Path

REFLEXION_LOG = "hotpotqa_distractor_rl/reflexion_logs/ReAct_base_100_questions_5_trials.txt"
REFLEXION_FIT = "wikipedia_react_hotpotqa_fit.txt"


def norm_question(text: str) -> str:
    """Lower case, runs of anything but letters and digits as one space (to match question texts)."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def reflexion_entries(text: str) -> list[dict]:
    """``{"trial", "section", "question", "lines"}`` per entry: the lines from ``Question:`` through
    ``Correct answer:``, unchanged."""
    out, trial, section, cur = [], None, None, None
    for ln in text.split("\n"):
        m = re.match(r"^BEGIN TRIAL (\d+)\s*$", ln)
        s = re.match(r"^-+ BEGIN (CORRECT|INCORRECT|HALTED) AGENTS -+\s*$", ln)
        if m or s or re.match(r"^#{5,}\s*$", ln):
            cur = None
            trial = int(m.group(1)) if m else trial
            section = s.group(1) if s else (None if m else section)
        elif ln.startswith("Question:") and section:
            cur = {"trial": trial, "section": section, "question": ln[len("Question:"):].strip(), "lines": [ln]}
            out.append(cur)
        elif cur is not None:
            cur["lines"].append(ln)
            if ln.startswith("Correct answer:"):
                cur = None
    return out


def reflexion_fit(log: Path, exclude: set[str]) -> tuple[str, dict]:
    """The derived log (trial 1, one run per question, questions in ``exclude`` left out) and its record."""
    entries = reflexion_entries(log.read_text())
    seen, kept, dropped = set(), [], []
    for e in entries:
        q = norm_question(e["question"])
        if e["trial"] != 1 or q in seen:
            continue
        seen.add(q)
        (dropped if q in exclude else kept).append(e)
    parts = ["#" * 40, "BEGIN TRIAL 1", "#" * 39]
    for section in ("CORRECT", "INCORRECT", "HALTED"):
        parts.append(f"------------- BEGIN {section} AGENTS -------------")
        for e in (e for e in kept if e["section"] == section):
            lines = list(e["lines"])
            while lines and not lines[-1].strip():
                lines.pop()
            parts += ["", *lines]
        parts.append("")
    record = {"trial": 1, "questions": len(seen), "kept": len(kept),
              "correct": sum(e["section"] == "CORRECT" for e in kept),
              "dropped_questions_also_in_fireact_fit_or_sample": sorted(e["question"] for e in dropped)}
    return "\n".join(parts) + "\n", record


def main(src: Path, out: Path) -> None:
    sel = json.loads((Path(__file__).parent.parent / "sample_data" / "selection.json").read_text())
    tau = json.loads((src / "tau_bench_airline/historical_trajectories/gpt-4o-airline.json").read_text())
    sample_tasks = {tau[i]["task_id"] for i in sel["tau_sample_indices"]}
    free = sorted({r["task_id"] for r in tau} - sample_tasks)
    tasks = [int(t) for t in free]
    tau_fit = [r for r in tau if r["task_id"] in tasks]
    fire_file = next((src / "fireact_hotpotqa/trajs").glob("*gpt-3.5*.json"))
    fire = json.loads(fire_file.read_text())
    fire_fit = {k: v for k, v in fire.items() if k not in set(sel["fireact_sample_keys"])}
    fire_questions = {norm_question(v["traj"][0]["content"]) for v in fire.values()}  # fit side and sample
    log_text, log_record = reflexion_fit(src / REFLEXION_LOG, fire_questions)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tau_airline_fit.json").write_text(json.dumps(tau_fit, ensure_ascii=False))
    (out / "fireact_gpt35_fit.json").write_text(json.dumps(fire_fit, ensure_ascii=False))
    (out / REFLEXION_FIT).write_text(log_text)
    (out / "fit_selection.json").write_text(json.dumps(
        {"tau_tasks": tasks, "tau_indices": [i for i, r in enumerate(tau) if r["task_id"] in tasks],
         "n_tau": len(tau_fit), "n_fireact": len(fire_fit), "reflexion": log_record}, indent=1) + "\n")
    print(f"tau tasks {tasks}: {len(tau_fit)} trajectories; FireAct {len(fire_fit)}; "
          f"Reflexion {log_record['kept']} ({log_record['correct']} correct)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
