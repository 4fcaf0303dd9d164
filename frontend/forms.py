"""The submit form: fields as a researcher thinks of them, turned into the same spec mapping the API takes.

The form checks only what is its own (a whole-or-slice choice, KEY=VALUE lines, argv quoting); everything else
is the spec parser's and the submit service's, whose errors name the field they belong to.
"""

from __future__ import annotations

import shlex
from typing import Any

from django import forms

from scheduling.jobs.services import job_spec_of
from scheduling.jobs.spec import spec_to_mapping

_SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "&", "2>", "2>&1"})
KINDS = (("whole", "Whole GPUs"), ("slice", "A slice of one GPU (memory and/or compute share)"))
COMMAND_FORMS = (
    ("argv", "Program and arguments (quoted as in a shell, no pipes)"),
    ("shell", "A shell line (run by /bin/sh -c: pipes, &&, $VARS)"),
)
TOPOLOGIES = (
    ("none", "Anywhere on the node"),
    ("numa", "One NUMA node"),
    ("nvlink", "All NVLink-connected"),
)


class JobForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="What you will recognise it by.")
    team = forms.ChoiceField()
    kind = forms.ChoiceField(choices=KINDS, initial="whole", widget=forms.RadioSelect, label="GPUs")
    gpus = forms.CharField(required=False, initial="1", label="GPUs per node")
    gpu_memory = forms.CharField(required=False, label="GPU memory", help_text="e.g. 10GiB")
    compute_pct = forms.CharField(required=False, label="Compute share (%)", help_text="1-100 of one card")
    gpu_models = forms.MultipleChoiceField(
        required=False,
        label="GPU models",
        help_text="None chosen: any model",
        widget=forms.CheckboxSelectMultiple,
    )
    min_gpu_memory = forms.CharField(required=False, label="Minimum card memory", help_text="e.g. 40GiB")
    topology = forms.ChoiceField(choices=TOPOLOGIES, initial="none")
    nodes = forms.CharField(initial="1", label="Nodes (gang)", help_text="More than 1: whole GPUs on each")
    priority = forms.ChoiceField(required=False, label="Priority class")
    max_runtime = forms.CharField(required=False, label="Runtime limit", help_text="e.g. 2h, 30m, 1h30m")
    checkpoint_interval = forms.CharField(
        required=False,
        label="Checkpoints every",
        help_text="Optional, e.g. 30m: preemption prefers jobs that lose the least work",
    )
    notify = forms.MultipleChoiceField(
        required=False,
        label="Tell me when it",
        choices=[("start", "starts"), ("end", "ends"), ("fail", "fails"), ("preempt", "is preempted")],
        widget=forms.CheckboxSelectMultiple,
        help_text="By email or your webhook (your notification settings); none ticked: your default",
    )
    cpu = forms.CharField(required=False, label="CPU per node", help_text="cores (4) or millicores (500m)")
    memory = forms.CharField(required=False, label="Host memory per node", help_text="e.g. 64GiB")
    command_form = forms.ChoiceField(
        choices=COMMAND_FORMS, initial="argv", widget=forms.RadioSelect, label="Command is"
    )
    command = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}))
    workdir = forms.CharField(
        required=False, label="Working directory", help_text="Absolute path on the node; empty: the agent's"
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        help_text="One NAME=value a line",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
    )

    def __init__(self, *args: Any, teams: list[str], models: list[str], priorities: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(t, t) for t in teams]
        self.fields["gpu_models"].choices = [(m, m) for m in models]
        self.fields["priority"].choices = [("", "The team's default"), *((p, p) for p in priorities)]

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for n, line in enumerate(self.cleaned_data.get("env", "").splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"Line {n} is not NAME=value: {line.strip()[:40]!r}.")
            env[name.strip()] = value
        return env

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("command_form") == "argv" and data.get("command"):
            try:
                words = shlex.split(data["command"])
            except ValueError as exc:
                self.add_error("command", f"The quoting does not close ({exc}); or choose a shell line.")
            else:
                operators = sorted({w for w in words if w in _SHELL_OPERATORS})
                if operators:
                    self.add_error(
                        "command",
                        f"{' '.join(operators)} would reach the program as plain arguments: choose "
                        '"A shell line" to run it through /bin/sh.',
                    )
                data["command_words"] = words
        return data

    def spec_mapping(self) -> dict[str, Any]:
        """The spec as the API takes it (call after is_valid())."""
        d = self.cleaned_data
        spec: dict[str, Any] = {
            "name": d["name"],
            "team": d["team"],
            "command": d.get("command_words") if d.get("command_form") == "argv" else d["command"],
            "env": d.get("env") or {},
            "topology": d.get("topology") or "none",
            "nodes": d.get("nodes") or "1",
        }
        if d.get("kind") == "slice":
            spec["gpu_memory"] = d.get("gpu_memory") or None
            spec["compute_pct"] = d.get("compute_pct") or None
        else:
            spec["gpus"] = d.get("gpus") or None
        for field in (
            "min_gpu_memory",
            "priority",
            "max_runtime",
            "checkpoint_interval",
            "cpu",
            "memory",
            "workdir",
        ):
            if d.get(field):
                spec[field] = d[field]
        if d.get("gpu_models"):
            spec["gpu_models"] = list(d["gpu_models"])
        if d.get("notify"):
            spec["notify"] = list(d["notify"])
        return {k: v for k, v in spec.items() if v is not None}

    def add_spec_error(self, field: str | None, message: str) -> None:
        """Show a spec or service refusal next to the field it names (the form's top when it names none)."""
        target = field if field in self.fields else None
        self.add_error(target, message)


def _command_form(command: str) -> str:
    """argv when the stored line reads back as plain words, else a shell line."""
    try:
        words = shlex.split(command)
    except ValueError:
        return "shell"
    plain = shlex.join(words) == command and not any(w in _SHELL_OPERATORS for w in words)
    return "argv" if plain else "shell"


def initial_from_job(job: Any) -> dict[str, Any]:
    """Form values that submit the same job again ("copy & edit"), in the units the spec is written in."""
    spec = spec_to_mapping(job_spec_of(job), team=job.team.slug)
    return {
        "name": spec["name"],
        "team": spec["team"],
        "kind": "whole" if job.gpus else "slice",
        "gpus": str(spec.get("gpus", 1)),
        "gpu_memory": spec.get("gpu_memory", ""),
        "compute_pct": str(spec.get("compute_pct", "")),
        "gpu_models": spec.get("gpu_models", []),
        "min_gpu_memory": spec.get("min_gpu_memory", ""),
        "topology": spec.get("topology", "none"),
        "nodes": str(spec.get("nodes", 1)),
        "priority": spec.get("priority", ""),
        "cpu": spec["cpu"],
        "memory": spec["memory"],
        "max_runtime": spec.get("max_runtime", ""),
        "checkpoint_interval": spec.get("checkpoint_interval", ""),
        "command_form": _command_form(job.command),
        "command": spec["command"],
        "env": "\n".join(f"{k}={v}" for k, v in spec.get("env", {}).items()),
        "workdir": spec.get("workdir", ""),
        "notify": [e for e in spec.get("notify", "").split(",") if e and e != "none"],
    }
