"""The submit form: fields as a researcher thinks of them, turned into the same spec mapping the API takes.

The form checks only what is its own (a whole-or-slice choice, KEY=VALUE lines, argv quoting); everything else
is the spec parser's and the submit service's, whose errors name the field they belong to. The priority list
offers the chosen team's classes only (page.js offers another team's when the team changes); a class the team
may not use is refused by the team's own rule, in its words, beside the field.
"""

from __future__ import annotations

import shlex
from typing import Any

from django import forms

from quotas.selectors import TeamAllowance
from scheduling.errors import ServiceError
from scheduling.jobs import fields
from scheduling.jobs.fields import SpecField
from scheduling.jobs.spec import dependencies_written, ports_written, spec_field_errors, spec_to_mapping
from scheduling.jobs.submit import job_spec_of
from scheduling.jobs.validation import team_priority_grant

_SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "&", "2>", "2>&1"})
KINDS = (("whole", "Whole GPUs"), ("slice", "A slice of one GPU (memory and/or compute share)"))
COMMAND_FORMS = (
    ("argv", "Program and arguments (quoted as in a shell, no pipes)"),
    ("shell", "A shell line (run by /bin/sh -c: pipes, &&, $VARS)"),
)
# How the form words a choice of the spec's.
CHOICE_WORDS = {
    "topology": {"none": "Anywhere on the node", "numa": "One NUMA node", "nvlink": "All NVLink-connected"},
    "notify": {"start": "starts", "end": "ends", "fail": "fails", "preempt": "is preempted"},
}
# Fields whose choices are this cluster's and this user's (set per form), and the initial values of a new job.
CHOSEN_HERE = ("team", "priority", "gpu_models")
INITIAL = {"gpus": "1", "nodes": "1", "topology": "none"}


def _form_field(spec_field: SpecField) -> forms.Field:
    """A spec field as the form shows it: the table's label and hint, a widget for how it is written."""
    name = spec_field.name
    common: dict[str, Any] = {
        "label": spec_field.label,
        "help_text": spec_field.form_help,
        "required": spec_field.required or name == "team",
        "initial": INITIAL.get(name),
    }
    area = forms.Textarea(attrs={"rows": 2, "spellcheck": "false"})
    if spec_field.kind in (fields.MODELS, fields.EVENT_LIST):
        words = CHOICE_WORDS.get(name, {})
        choices = [(c, words.get(c, c)) for c in spec_field.choices]
        return forms.MultipleChoiceField(choices=choices, widget=forms.CheckboxSelectMultiple, **common)
    if spec_field.kind == fields.CHOICE or name in CHOSEN_HERE:
        words = CHOICE_WORDS.get(name, {})
        return forms.ChoiceField(choices=[(c, words.get(c, c)) for c in spec_field.choices], **common)
    if spec_field.kind in (fields.COMMAND, fields.ENV):
        return forms.CharField(widget=area, **common)
    return forms.CharField(max_length=spec_field.high if spec_field.kind == fields.TEXT else None, **common)


# The spec's fields that the form shows (those the table gives a label), under the spec's own names.
SpecFields = type("SpecFields", (forms.Form,), {f.name: _form_field(f) for f in fields.FIELDS if f.label})


class JobForm(SpecFields):
    """The spec's fields, plus two choices of the form's own: whole cards or a slice, argv or a shell line."""

    kind = forms.ChoiceField(choices=KINDS, initial="whole", widget=forms.RadioSelect, label="GPUs")
    command_form = forms.ChoiceField(
        choices=COMMAND_FORMS, initial="argv", widget=forms.RadioSelect, label="Command is"
    )
    interactive = forms.BooleanField(
        required=False,
        label="Interactive session",
        help_text="A notebook or dashboard you work in (the spec's kind: interactive)",
    )

    def __init__(
        self,
        *args: Any,
        allowances: dict[str, TeamAllowance],
        models: list[str],
        images: dict[str, dict[str, list[str]]] | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.allowances = allowances
        # For page.js and the hints: each team's allowed images and mounts (quotas.selectors.team_image_settings).
        self.images_by_team = images or {}
        self.fields["team"].choices = [(t, t) for t in allowances]
        self.fields["gpu_models"].choices = [(m, m) for m in models]
        known = next(iter(allowances.values())).known_classes if allowances else ()
        priority = self.fields["priority"]
        # Any class is taken (one the team may not use is refused in the team's words, not as "not a choice");
        # the list offers the chosen team's.
        priority.choices = [("", "The team's default"), *((p, p) for p in known)]
        team, chosen = self["team"].value(), self["priority"].value()
        priority.widget.choices = [
            *priority_options(allowances.get(team)),
            *(
                [(chosen, f"{chosen} (not allowed for {team})")]
                if chosen and team in allowances and allowances[team].grant_of(chosen) is None
                else []
            ),
        ]

    def images_of_team(self) -> dict[str, list[str]]:
        """The chosen team's allowed images and mounts, for the hints beside those fields."""
        return self.images_by_team.get(self["team"].value() or "", {"images": [], "mounts": []})

    def priority_options_by_team(self) -> dict[str, list[tuple[str, str]]]:
        """For page.js: the priority list each of the user's teams offers."""
        return {slug: priority_options(allowance) for slug, allowance in self.allowances.items()}

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
        allowance = self.allowances.get(data.get("team") or "")
        if data.get("priority") and allowance is not None:
            try:
                team_priority_grant(priority=data["priority"], allowance=allowance)
            except ServiceError as exc:
                self.add_error("priority", exc.message)
        return data

    def spec_mapping(self) -> dict[str, Any]:
        """The spec as the API takes it (after is_valid(); before, what of it the form's own checks passed)."""
        d = self.cleaned_data
        spec: dict[str, Any] = {
            "name": d.get("name"),
            "team": d.get("team"),
            "command": d.get("command_words") if d.get("command_form") == "argv" else d.get("command"),
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
            "array",
            "depends_on",
            "ports",
            "image",
            "mounts",
        ):
            if d.get(field):
                spec[field] = d[field]
        if d.get("gpu_models"):
            spec["gpu_models"] = list(d["gpu_models"])
        if d.get("notify"):
            spec["notify"] = list(d["notify"])
        if d.get("interactive"):
            spec["kind"] = "interactive"
        return {k: v for k, v in spec.items() if v not in (None, "")}

    def add_spec_field_errors(self) -> None:
        """The spec's own refusal of every field the form passed, beside each (all at once: a missing command
        and two GPUs written "two" are both said), unless the field has one already."""
        for field, message in spec_field_errors(self.spec_mapping()).items():
            if field in self.fields and field not in self.errors:
                self.add_error(field, _beside_its_field(field, message))

    def add_spec_error(self, field: str | None, message: str) -> None:
        """Show a spec or service refusal next to the field it names (the form's top when it names none)."""
        target = field if field in self.fields else None
        self.add_error(target, _beside_its_field(target, message))


def _beside_its_field(field: str | None, message: str) -> str:
    """A refusal shown beside its field, without the spec's key for it: beside "Minimum card memory" it read
    "min_gpu_memory must be a size such as '10GiB' ...", now "Must be a size such as '10GiB' ..." (the API and the
    CLI, which have no field to show it beside, keep the key)."""
    said = f"{field} must "
    return "Must " + message[len(said) :] if field and message.startswith(said) else message


def priority_options(allowance: TeamAllowance | None) -> list[tuple[str, str]]:
    """The priority list for a team: its default first (named), then each class it may use, highest first."""
    if allowance is None:
        return [("", "The team's default")]
    default = allowance.default_class
    first = f"The team's default ({default.name})" if default else "The team's default"
    return [("", first), *((g.priority_class.name, g.priority_class.name) for g in allowance.classes)]


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
        "array": spec.get("array", ""),
        "depends_on": dependencies_written(
            spec.get("depends_on", []), singleton=spec.get("singleton", False)
        ),
        "notify": [e for e in spec.get("notify", "").split(",") if e and e != "none"],
        "interactive": job.kind == "interactive",
        "ports": ports_written(job.ports),
        "image": job.image,
        "mounts": ",".join(job.mounts or ()),
    }
