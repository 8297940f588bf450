"""Dashboard forms: input checking only; the work is done by services."""

from __future__ import annotations

import json
import re

from django import forms

from engine.hooks import ALL_HOOKS
from engine.plugins.scaffold import DEFAULT_HOOKS, MAX_DESCRIPTION
from engine.process.runtimes import RUNTIMES
from plugins_app.models import Role
from plugins_app.selectors import alerts as alert_selectors
from plugins_app.selectors import dashboard


class CreatePluginForm(forms.Form):
    name = forms.CharField(max_length=128, strip=True)
    description = forms.CharField(max_length=MAX_DESCRIPTION, required=False, strip=True,
                                  widget=forms.Textarea(attrs={"rows": 2}))
    author = forms.CharField(max_length=200, required=False, strip=True)
    runtime = forms.ChoiceField(choices=[(t, t) for t in RUNTIMES], initial="python")
    hooks = forms.MultipleChoiceField(choices=[(h, h) for h in ALL_HOOKS], initial=list(DEFAULT_HOOKS),
                                      widget=forms.CheckboxSelectMultiple, required=True,
                                      error_messages={"required": "Pick at least one hook to scaffold."})

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        problem = dashboard.name_problem(name)
        if problem:
            raise forms.ValidationError(problem)
        return name


class InstallForm(forms.Form):
    SOURCES = [("local", "Local path"), ("git", "Git URL"), ("registry", "Registry")]
    source = forms.ChoiceField(choices=SOURCES, initial="local", widget=forms.RadioSelect)
    path = forms.CharField(required=False, max_length=4096, strip=True)
    url = forms.CharField(required=False, max_length=2048, strip=True)
    ref = forms.CharField(required=False, max_length=200, strip=True)
    name = forms.CharField(required=False, max_length=128, strip=True)
    registry = forms.CharField(required=False, max_length=300, strip=True)

    def clean(self):
        data = super().clean()
        need = {"local": "path", "git": "url", "registry": "name"}.get(data.get("source") or "")
        if need and not data.get(need):
            self.add_error(need, "This field is required for this source.")
        return data

    def source_dict(self) -> dict:
        d = self.cleaned_data
        if d["source"] == "local":
            return {"source": "local", "path": d["path"]}
        if d["source"] == "git":
            return {"source": "git", "url": d["url"], **({"ref": d["ref"]} if d["ref"] else {})}
        return {"source": "registry", "name": d["name"], **({"registry": d["registry"]} if d["registry"] else {})}


class EngineConfigForm(forms.Form):
    MODES = [("default", "Built-in default engine"), ("plugin", "One plugin"), ("stack", "A stack of plugins")]
    mode = forms.ChoiceField(choices=MODES, widget=forms.RadioSelect)
    plugin = forms.CharField(required=False, max_length=128, strip=True)
    stack = forms.CharField(required=False, max_length=4000, strip=True,
                            help_text="Plugin names in order, separated by commas or new lines.")

    def clean(self):
        data = super().clean()
        mode = data.get("mode")
        if mode == "plugin" and not data.get("plugin"):
            self.add_error("plugin", "Choose the plugin to use.")
        if mode == "stack":
            names = [n.strip() for n in (data.get("stack") or "").replace("\n", ",").split(",") if n.strip()]
            if not names:
                self.add_error("stack", "List at least one plugin.")
            data["stack_names"] = names
        return data


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.AGENT)
    agents = forms.CharField(required=False, max_length=14_000, strip=True,
                             help_text="agent tokens: the agent ids it may act for, separated by commas or spaces "
                                       "(a trailing * for a prefix); empty: every agent")

    def clean_agents(self) -> list[str]:
        return [a for a in re.split(r"[\s,]+", self.cleaned_data.get("agents") or "") if a]


class TestHookForm(forms.Form):
    hook = forms.ChoiceField(choices=[(h, h) for h in ALL_HOOKS])
    payload = forms.CharField(max_length=1_000_000, strip=False)

    def clean_payload(self):
        try:
            value = json.loads(self.cleaned_data["payload"])
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("The request must be a JSON object ({…}).")
        return value


class AlertRulesForm(forms.Form):
    """[alerts] as the Alerts page edits it: which rules are on, their thresholds, the webhooks (one per line,
    "<format> <url>")."""

    rules = forms.MultipleChoiceField(choices=[(r, r) for r in alert_selectors.RULES], required=False,
                                      widget=forms.CheckboxSelectMultiple)
    fallback_rate = forms.FloatField(min_value=0.01, max_value=1.0,
                                     help_text="fraction of agent calls answered by the default engine, 0.01-1")
    queue_lag = forms.IntegerField(min_value=1, max_value=1_000_000, help_text="jobs waiting for a worker")
    webhooks = forms.CharField(required=False, max_length=20_000, widget=forms.Textarea(attrs={"rows": 3}),
                               help_text='one per line: "json https://…", "slack https://…" or "ntfy https://…"')

    def clean_webhooks(self) -> list[dict]:
        hooks, problems = [], []
        for number, line in enumerate(self.cleaned_data["webhooks"].splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            fmt, url = (parts[0], parts[1]) if len(parts) == 2 else ("json", parts[0]) if len(parts) == 1 else ("", "")
            if fmt not in alert_selectors.FORMATS:
                problems.append(f"line {number}: the format must be one of {', '.join(alert_selectors.FORMATS)}")
            elif not re.fullmatch(r"https?://[^\s/]+\S*", url):
                problems.append(f"line {number}: {url!r} is not an http(s) URL")
            else:
                hooks.append({"format": fmt, "url": url})
        if problems:
            raise forms.ValidationError(problems)
        return hooks

    @classmethod
    def initial_from(cls, config: alert_selectors.AlertConfig) -> dict:
        return {"rules": config.rules, "fallback_rate": config.fallback_rate, "queue_lag": config.queue_lag,
                "webhooks": "\n".join(f"{w['format']} {w['url']}" for w in config.webhooks)}
