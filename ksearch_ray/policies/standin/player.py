"""The stand-in's play: read a ksearch prompt as a planner or coder would, and answer like one.

It is an honest actor, not an oracle: it reads only the prompt's text, as a model does, and knows
nothing of the task beyond it. As a planner it reads the tunables the kernel in the prompt declares
(`NAME = value  # tunable: [choices]`) and proposes, in words, actions that change them ("Set BLOCK_M
to 128"), and a few bold rewrites; it leaves out ideas the world model already holds and keeps to
the number of new actions the prompt allows. As a coder it reads the action it is asked to
implement and the code it is shown (the parent's, the best attempt's, the failed one's, the
reference's), writes the change, and now and then a broken first draft, which it debugs from the
error text the next prompt shows. Which tunable values are faster it never knows: the search
measures. Its habits drift from the formats as real models do (`habits.Habits`). Every choice is a
function of the prompt text and the stand-in's seed, so the same prompt gets the same answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
from typing import Any

from ksearch_ray.policies.standin.code import break_code, fix_code, from_reference, interface
from ksearch_ray.policies.standin.habits import Habits
from ksearch_ray.taskspec.tunables import TunableError, read_tunables, rewrite_tunables

PLAN_KINDS = ("initialize_tree", "propose_actions", "refine", "too_hard")
SET_ACTION = re.compile(r"Set (\w+) to (.+?)\s*$", re.MULTILINE)
BOLD = "bold rewrite"
"""Words in an action that tell the coder its first draft will be a risky one."""
CODE_BLOCK = re.compile(r"```(?:python|py)?\n(.*?)\n```", re.DOTALL)


def _roll(text: str, salt: str, seed: int) -> int:
    """0..99, the same for the same prompt, salt and seed."""
    digest = hashlib.sha256(f"{seed}:{salt}:{text}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100


def section(text: str, heading: str) -> str:
    """The body under `# heading` up to the next top-level heading outside a fenced code block (a
    Python comment at the start of a line of code is not a heading)."""
    body: list[str] | None = None
    fence: str | None = None
    for line in text.splitlines():
        if fence is None and line.startswith("# "):
            if body is not None:
                break
            if line[2:].startswith(heading):
                body = []
                continue
        if body is not None:
            body.append(line)
        opener = re.match(r"^(`{3,})[\w+-]*\s*$", line)
        if fence is None and opener:
            fence = opener.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
    return "\n".join(body).strip() if body is not None else ""


def first_code(text: str) -> str | None:
    match = CODE_BLOCK.search(text)
    return match.group(1) if match else None


def focus_id(text: str, *headings: str) -> str | None:
    for heading in headings:
        body = section(text, heading)
        match = re.match(r"(n\d+|root)\b", body)
        if match:
            return match.group(1)
    return None


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip().strip("'\"")


class Player:
    def __init__(self, seed: int = 0, habits: Habits | None = None):
        self.seed = seed
        self.habits = habits or Habits()
        self._plans = itertools.count()  # free-text plans answered: the index into habits.plan_shapes
        self._asked: dict[str, int] = {}  # prompt -> times asked: a prompt asked again gets a fresh draw
        self._drafts = itertools.count(1)  # code replies written: their number, with habits.distinct_code

    def _again(self, prompt: str) -> Player:
        """The player for this asking of `prompt`: itself the first time; with another seed each time the same
        prompt comes back (a model sampling at a temperature answers a repeated prompt anew)."""
        key = hashlib.sha256(prompt.encode()).hexdigest()
        n = self._asked.get(key, 0)
        self._asked[key] = n + 1
        if n == 0:
            return self
        other = Player(self.seed + 7919 * n, self.habits)
        other._plans, other._asked, other._drafts = self._plans, self._asked, self._drafts
        return other

    def answer(self, messages: list[dict[str, Any]], structured: bool) -> str:
        return self._again(json.dumps(messages, sort_keys=True))._answer(messages, structured)

    def _answer(self, messages: list[dict[str, Any]], structured: bool) -> str:
        first = next((str(m["content"]) for m in messages if m.get("role") == "user"), "")
        kind_match = re.search(r"^Call: (\w+)", first, re.MULTILINE)
        kind = kind_match.group(1) if kind_match else "unknown"
        reask = len([m for m in messages if m.get("role") == "user"]) > 1
        if kind in PLAN_KINDS:
            return self._plan(kind, first, structured, reask)
        return self._code(kind, first)

    # --- planner ----------------------------------------------------------------------------------

    def _plan(self, kind: str, text: str, structured: bool, reask: bool) -> str:
        ops = {
            "initialize_tree": self._initialize, "propose_actions": self._propose,
            "refine": self._refine, "too_hard": self._too_hard,
        }[kind](text)
        h = self.habits
        if _roll(text, "missing-fields", self.seed) < h.missing_fields:
            for op in ops:  # a model that gives the idea and leaves out the estimates
                if op["op"] == "insert":
                    op.pop("expected_speedup", None)
                    op.pop("difficulty", None)
        if structured:
            return json.dumps({"ops": ops})
        shape = "plain" if reask else self._plan_shape(text)
        if shape == "prose_only":
            return "I would keep tuning the block sizes and look at the memory traffic next."
        if shape == "broken_json":
            return "Edits:\n```json\n" + json.dumps({"ops": ops})[:-2] + ",]}\n```"
        if shape == "other_shape":
            return "Here is my plan.\n```json\n" + json.dumps(self._other_shape(ops)) + "\n```"
        return "Plan below.\n```json\n" + json.dumps({"ops": ops}, indent=1) + "\n```"

    def _plan_shape(self, text: str) -> str:
        h = self.habits
        if h.plan_shapes:
            return h.plan_shapes[next(self._plans) % len(h.plan_shapes)]
        roll = _roll(text, "plan-shape", self.seed)
        if roll < h.prose_only:
            return "prose_only"
        if roll < h.prose_only + h.broken_json:
            return "broken_json"
        return "other_shape" if roll < h.prose_only + h.broken_json + h.other_shape else "plain"

    def _other_shape(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """How other models answer: inserts as bare records in `actions`, `parent_id` for `parent`."""
        inserts = [{k: v for k, v in op.items() if k not in ("op", "parent")} for op in ops if op["op"] == "insert"]
        others = []
        for op in ops:
            if op["op"] == "insert":
                continue
            renamed = dict(op)
            if "node" in renamed:
                renamed["node_id"] = renamed.pop("node")
            others.append(renamed)
        return {"ops": others, "actions": inserts}

    @staticmethod
    def _limit(text: str, default: int) -> int:
        """New actions this reply may add, as the prompt says."""
        said = re.search(r"may add at most (\d+) new actions", text) or re.search(r"Propose up to (\d+)", text)
        return int(said.group(1)) if said else default

    @staticmethod
    def _known_titles(text: str, parent: str) -> set[str]:
        """Titles of the actions the world model already holds under `parent` (done, open, closed or too
        hard), as its action tree shows them indented under it: not proposed again there."""
        tree = section(text, "World model")
        lines = tree.splitlines()
        if parent == "root":
            start, depth = next((i for i, line in enumerate(lines) if line.startswith("root: ")), -1), 0
        else:
            start = next((i for i, line in enumerate(lines) if re.match(rf"\s*{parent} \[", line)), -1)
            depth = len(lines[start]) - len(lines[start].lstrip()) if start >= 0 else 0
        known = set()
        for line in lines[start + 1:] if start >= 0 else []:
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent <= depth:
                break
            match = re.match(r"\s*n\d+ \[\w+\] (.+?) \(d\d", line)
            if match and indent == depth + 2:
                known.add(match.group(1).strip().casefold())
        return known

    def _proposals(self, text: str, code: str | None, parent: str, limit: int, *, bold: int = 0) -> list[dict[str, Any]]:
        known = self._known_titles(text, parent)
        ops: list[dict[str, Any]] = []
        try:
            tunables = read_tunables(code or "")
        except TunableError:
            tunables = {}
        ideas: list[tuple[str, str, str, bool]] = []
        for i in range(bold):
            title = f"Restructure the hot loop, variant {i + 1} ({BOLD})"
            ideas.append((title, "A bold restructuring of the main computation; its first draft may not work.",
                          "bolder changes find what tunables cannot", True))
        for tunable in tunables.values():
            for choice in tunable.choices:
                if choice == tunable.value:
                    continue
                ideas.append((f"Set {tunable.name} to {choice!r}",
                              f"Change the tunable {tunable.name} from {tunable.value!r} to {choice!r}.",
                              f"{tunable.name} is a tunable of this kernel; the measurements will say if {choice!r} is faster",
                              False))
        if not tunables and code is None:  # no code to read: ideas a model would have from the task alone
            ideas += [("Port the reference computation as the kernel", "Write the kernel as the reference computes it.",
                       "a correct first kernel to build on", False),
                      ("Run the matrix products in TF32", "Allow TF32 in the matrix products.",
                       "tensor cores, within the tolerance", False)]
        # The bold ideas first, then the tunable changes in an order of the stand-in's own.
        bold_ideas = [i for i in ideas if i[3]]
        plain = sorted((i for i in ideas if not i[3]), key=lambda i: _roll(text + i[0], "order", self.seed))
        for title, description, rationale, risky in [*bold_ideas, *plain]:
            if len(ops) >= limit:
                break
            if title.casefold() in known:
                continue
            ops.append({
                "op": "insert", "parent": parent, "title": title, "description": description,
                # Bold ideas look promising before they are tried: the planner ranks them first.
                "difficulty": 2 if risky else 1, "score": 0.7 if risky else 0.6, "expected_speedup": 1.1,
                "rationale": rationale,
            })
        return ops

    def _initialize(self, text: str) -> list[dict[str, Any]]:
        code = first_code(section(text, "Starting point"))
        ops = self._proposals(text, code, "root", self._limit(text, 6), bold=self.habits.breakage_actions)
        ops += [
            {"op": "update", "node": "root", "summary": "The starting kernel, as given; its tunables are untried."},
            {"op": "add_hypothesis", "text": "The tunables are far from their best values", "ref": "h"},
            {"op": "add_question", "text": "Which tunable matters most?"},
        ]
        return ops

    def _propose(self, text: str) -> list[dict[str, Any]]:
        node = focus_id(text, "Node to expand") or "root"
        code = first_code(section(text, "Its code"))
        return self._proposals(text, code, node, self._limit(text, 3), bold=1)

    def _refine(self, text: str) -> list[dict[str, Any]]:
        node = focus_id(text, "The action just implemented") or "root"
        evidence = section(text, "Evidence from the cycle")
        speedups = re.findall(r"([0-9.]+)x over the parent", evidence)
        rating = 7 if speedups and float(speedups[-1]) > 1.0 else 3
        ops: list[dict[str, Any]] = [
            {"op": "update", "node": node, "rating": rating, "note": f"measured {speedups[-1] if speedups else '?'}x over the parent"},
        ]
        hypotheses = re.findall(r"^(h\d+) \[open\]", section(text, "World model"), re.MULTILINE)
        if hypotheses:
            ops.append({"op": "annotate", "target": hypotheses[0], "stance": "for" if rating > 5 else "against",
                        "text": f"{node}: {speedups[-1] if speedups else '?'}x over its parent"})
        ops += self._proposals(text, first_code(section(text, "Best code of this action")), node, self._limit(text, 3))
        return ops

    def _too_hard(self, text: str) -> list[dict[str, Any]]:
        node = focus_id(text, "The action that failed") or "root"
        evidence = section(text, "Evidence from the cycle")
        errors = [line.strip() for line in evidence.splitlines() if line.startswith("    ") and line.strip()]
        reason = f"the attempts failed: {errors[0][:200]}" if errors else "no attempt produced working code"
        ops: list[dict[str, Any]] = [{"op": "mark_too_hard", "node": node, "reason": reason}]
        if _roll(text, "split", self.seed) < 50:
            ops.append({"op": "split", "node": node, "reason": "smaller steps", "alternatives": [
                {"title": f"A smaller first step towards {node}", "description": "the same goal, one change at a time.",
                 "difficulty": 1, "score": 0.3, "expected_speedup": 1.02},
            ]})
        return ops

    # --- coder ------------------------------------------------------------------------------------

    def _code(self, kind: str, text: str) -> str:
        h = self.habits
        if _roll(text, "code-shape", self.seed) < h.coder_prose_only:
            return "The right approach is to restructure the loads; I will leave that for the next attempt."
        entry, _, _ = interface(section(text, "Interface"))
        action = section(text, "Action to implement") or section(text, "Action being implemented")
        if kind == "debug":
            source, what = self._debug(text, entry)
        else:
            source, what = self._write(kind, text, action, entry)
        if source is None:
            return what
        if h.distinct_code:
            mark = "//" if "#include" in source else "#"
            source = f"{mark} draft {next(self._drafts)}\n{source}"
        return self._shaped(text, what, source)

    def _base(self, kind: str, text: str) -> str | None:
        """The code the call works from, as the prompt shows it."""
        for heading in ("Best attempt so far (passes)", "Current solution", "Parent program"):
            code = first_code(section(text, heading))
            if code is not None:
                return code
        if kind == "generate_from_spec":
            reference = first_code(section(text, "Reference implementation"))
            if reference is not None:
                return from_reference(reference, section(text, "Interface"))
        return None

    def _write(self, kind: str, text: str, action: str, entry: str) -> tuple[str | None, str]:
        base = self._base(kind, text)
        if base is None:
            return None, "I cannot write this kernel without the reference or a starting point in front of me."
        source, what = base, "Writes the reference computation as the kernel." if kind == "generate_from_spec" else ""
        planned = SET_ACTION.search(action.splitlines()[0]) if action else None
        if planned and kind == "improve":  # the action is in the best attempt already: something more
            planned = None
        change: dict[str, Any] = {}
        if planned:
            change = {planned.group(1): _value(planned.group(2))}
        elif "TF32" in action and "allow_tf32 = False" in source:
            source = source.replace("allow_tf32 = False", "allow_tf32 = True")
            what = "Allows TF32 in the matrix products."
        elif kind != "generate_from_spec" or not action:
            change = self._own_change(kind, text, source)
        if change:
            with contextlib.suppress(TunableError):  # a tunable the code no longer has: leave it
                source = rewrite_tunables(source, change)
            what = f"Sets {', '.join(f'{k} to {v!r}' for k, v in change.items())}."
        first = kind in ("generate_from_base", "generate_from_spec")
        # A bold action's first draft is broken; any draft now and then; a change of its own choosing too.
        draft = (BOLD in action and first) or _roll(text, "broken-draft", self.seed) < self.habits.broken_code or (
            not planned and not first and _roll(text, "own-risky", self.seed) < self.habits.risky_changes)
        if draft:
            broken = self._break(text, source, entry)
            if broken != source:
                return broken, (what + " " if what else "") + "A first draft of a bolder restructuring."
        return source, what or "Applies the change to the current code."

    def _break(self, text: str, source: str, entry: str) -> str:
        kinds = self.habits.breakages or ["syntax"]
        how = kinds[_roll(text, "breakage", self.seed) % len(kinds)]
        broken = break_code(source, how, entry, _roll(text, "where", self.seed))
        return broken if broken != source else break_code(source, "syntax", entry, 0)

    def _debug(self, text: str, entry: str) -> tuple[str | None, str]:
        """Fix the failed attempt from its evaluation's text; with no code to fix, start again from the
        last code that passed."""
        failed = section(text, "Attempt that failed")
        code = first_code(failed.split("Its evaluation:", 1)[0])
        if code is None:
            passed = first_code(section(text, "Last code that passed"))
            if passed is None:
                return None, "I cannot see any code to work from."
            action = section(text, "Action being implemented")
            planned = SET_ACTION.search(action.splitlines()[0]) if action else None
            if planned:
                with contextlib.suppress(TunableError):
                    passed = rewrite_tunables(passed, {planned.group(1): _value(planned.group(2))})
            return passed, "The last reply had no code; this applies the action to the last code that passed."
        evidence = failed.split("Its evaluation:", 1)[1] if "Its evaluation:" in failed else failed
        fixed = fix_code(code, evidence)
        if fixed is None:
            # Nothing in the error says what to change: a crash or a hang it cannot see into.
            return code, "I could not find the cause in the error; trying the same code again."
        return fixed, "The error points at the line changed here; this fixes it and keeps the action."

    def _own_change(self, kind: str, text: str, source: str) -> dict[str, Any]:
        """A tunable change of its own: often one an inspiration in the prompt has, never one the latest
        failed attempt made."""
        try:
            tunables = read_tunables(source)
        except TunableError:
            tunables = {}
        tried = set(re.findall(r"^\+(\w+) = (.+?)\s+# tunable", section(text, "The latest attempt, which failed"),
                               re.MULTILINE))
        borrowed: list[tuple[str, Any]] = []
        for code in CODE_BLOCK.findall(section(text, "Inspirations")):
            with contextlib.suppress(TunableError):
                borrowed += [(n, t.value) for n, t in read_tunables(code).items()
                             if n in tunables and t.value != tunables[n].value and t.value in tunables[n].choices]
        options = [(t.name, c) for t in tunables.values() for c in t.choices
                   if c != t.value and (t.name, repr(c)) not in tried and (t.name, json.dumps(c)) not in tried]
        roll = _roll(text, "own-change", self.seed)
        pool = borrowed if borrowed and roll % 2 == 0 else options
        if not pool:
            return {}
        name, value = pool[_roll(text, "own-pick", self.seed) % len(pool)]
        return {name: value}

    def _shaped(self, text: str, what: str, source: str) -> str:
        """The reply around the code, in the format asked for or, now and then, drifting from it."""
        body = source.rstrip()
        roll = _roll(text, "code-drift", self.seed)
        if roll < self.habits.code_drift:
            shape = roll % 3
            if shape == 0:
                return f"{what}\n\n```\n{body}\n```\n"
            if shape == 1:
                return f"{what}\n\n~~~python\n{body}\n~~~\n"
            return f"{what}\n\n```python\n{body}\n```\n\nUse it as before:\n\n```python\nresult = kernel(data)\n```\n"
        return f"{what}\n\n```python\n{body}\n```\n"
