"""Write a scripted model (agent.scripted_model) that replays a kernel file's git history as `propose` edits.

Each commit that changed the file becomes one proposal on the previous commit's version (named h-<sha>, so
the chain stacks even where a step was not kept), with the commit's subject as hypothesis and, where the
message states a measured outcome ("... -> 293.0/305.4/316.4"), that as the prediction. The engineer's
other moves are scripted where they were made: a look at the outline and a profile at the start, notes
before the big changes, a profile after one, a compare of the end against the start. Three bad proposals
are mixed in: one that gives a wrong result, one that does not compile (diagnosed, then repaired), and a
knob change expected to be slower.

Usage: python -m megakernel_agent.agent.history_script START_COMMIT [END_COMMIT] --out DIR
Writes DIR/script.jsonl and DIR/start.cu (the START_COMMIT version, the session's starting kernel).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
from pathlib import Path

from .edits import Edit, apply_edits

KERNEL = "kernels/kimi_linear/seed.cu"
CONTEXTS = (2048, 8192, 16384)
TRIPLE = re.compile(r"->\s*(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)")
CONTEXT_LINES = 3
TYPO_AT = "c0861b6"       # the commit proposed first with a typo, then repaired
SLOWER_AFTER = "a54535b"  # the commit after which a slower knob change is tried


def git(*args: str, root: Path) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def commits(start: str, end: str, root: Path, skip: set[str]) -> list[str]:
    """START and every later commit up to END that changed the kernel file, oldest first, but `skip`."""
    later = git("log", "--format=%h", "--reverse", f"{start}..{end}", "--", KERNEL, root=root).split()
    return [git("rev-parse", "--short", start, root=root).strip(), *(c for c in later if c not in skip)]


def edits_between(old: str, new: str) -> list[Edit]:
    """Search/replace edits turning `old` into `new`: one per changed region, with enough unchanged lines
    around it that its search text occurs once; checked by applying them."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    edits: list[Edit] = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT_LINES):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        while old.count("".join(a[i1:i2])) != 1 and (i1 > 0 or i2 < len(a)):
            if i1 > 0:
                i1, j1 = i1 - 1, j1 - 1
            else:
                i2, j2 = i2 + 1, j2 + 1
        edits.append(Edit(search="".join(a[i1:i2]), replace="".join(b[j1:j2])))
    if apply_edits(old, edits) != new:
        raise RuntimeError("the edits do not reproduce the new version")
    return edits


def prediction(message: str) -> dict[int, float]:
    """The last 'a/b/c' after '->' in a commit message, as µs per timed context."""
    found = TRIPLE.findall(message)
    return dict(zip(CONTEXTS, map(float, found[-1]), strict=True)) if found else {}


def use(tool: str, **inp) -> dict:
    return {"type": "tool_use", "name": tool, "input": inp}


def turn(*blocks: dict, text: str = "") -> dict:
    return {"content": ([{"type": "text", "text": text}] if text else []) + list(blocks), "stop_reason": "tool_use"}


def one_edit(source: str, search: str, replace: str) -> list[dict]:
    if source.count(search) != 1:
        raise RuntimeError(f"the scripted bad edit's anchor {search!r} does not occur exactly once")
    return [{"search": search, "replace": replace}]


def script(start: str, end: str, root: Path, skip: set[str] = frozenset()) -> tuple[str, list[dict]]:
    """(the start version's source, the script's turns)."""
    shas = commits(start, end, root, skip)
    sources = {s: git("show", f"{s}:{KERNEL}", root=root) for s in shas}
    turns = [turn(use("outline", version="best"), text="Where does the starting kernel spend its time?"),
             turn(use("profile", version="best"))]
    parent = "best"
    for n, sha in enumerate(shas[1:], 1):
        message = git("log", "-1", "--format=%B", sha, root=root)
        subject = message.splitlines()[0]
        prev = shas[n - 1]
        edits = [e.model_dump() for e in edits_between(sources[prev], sources[sha])]
        name = f"h-{sha}"
        proposal = dict(parent=parent, name=name, hypothesis=subject[:600], predicted_us=prediction(message),
                        edits=edits)
        if n == 2:   # a bug of the kind the checks exist for: attention over one token too few
            bad = one_edit(sources[prev], "const int tokens = cx.ctx_len + 1;", "const int tokens = cx.ctx_len;")
            turns += [turn(use("propose", parent=parent, name="attn-skip-new-token", hypothesis=(
                        "score only the cached tokens; the new token's row is appended in the same step and its "
                        "score costs a tile of its own"), edits=bad)),
                      turn(use("diagnose", version="attn-skip-new-token"))]
        if sha.startswith(TYPO_AT):  # the same change with a typo: it does not build; diagnosed and repaired
            new_source = sources[sha]
            anchor = "__device__ float block_sum(float v, float* red) {"
            typo = new_source.replace(anchor, anchor[:-2], 1)
            broken = dict(proposal, name=f"{sha}-typo", edits=[e.model_dump() for e in edits_between(
                sources[prev], typo)])
            repair = one_edit(typo, anchor[:-2] + "\n", anchor + "\n")
            turns += [turn(use("note", kind="prediction", text=f"{subject[:300]}; predicted {prediction(message)}",
                               refs=[parent]), use("propose", **broken)),
                      turn(use("diagnose", version=f"{sha}-typo")),
                      turn(use("propose", parent=f"{sha}-typo", name=name, hypothesis=f"repair: {subject[:500]}",
                               predicted_us=prediction(message), edits=repair))]
            turns.append(turn(use("profile", version=name)))
        else:
            turns.append(turn(use("propose", **proposal)))
        if sha.startswith(SLOWER_AFTER):  # a knob change that should cost time: no prefetch of the next phase
            turns.append(turn(use("propose", parent=name, name="no-prefetch", hypothesis=(
                "PREFETCH 0: the next phase's first chunk may contend with the current phase's stream"),
                knobs={"PREFETCH": 0})))
        parent = name
    turns += [turn(use("profile", version="best")),
              turn(use("compare", a="seed", b="best", rounds=2)),
              turn(use("finish", reason="the recorded history is replayed"))]
    return sources[shas[0]], turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("start")
    ap.add_argument("end", nargs="?", default="HEAD")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", default="claude-sonnet-4-5", help="the model id the script plays (for prices)")
    ap.add_argument("--skip", action="append", default=[], metavar="SHA",
                    help="a commit to leave out (e.g. one that never ran); the next one is diffed against its parent")
    args = ap.parse_args()
    root = Path(git("rev-parse", "--show-toplevel", root=Path.cwd()).strip())
    start_source, turns = script(args.start, args.end, root, set(args.skip))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "start.cu").write_text(start_source)
    skipped = f" without {', '.join(args.skip)}" if args.skip else ""
    header = {"model": args.model, "description": f"git history of {KERNEL} {args.start}..{args.end}{skipped}"}
    (args.out / "script.jsonl").write_text("\n".join(json.dumps(x) for x in [header, *turns]) + "\n")
    print(f"{len(turns)} turns, start {args.start}, written to {args.out}")


if __name__ == "__main__":
    main()
