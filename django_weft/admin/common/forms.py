"""The admin's form fields, shared by the run tools' forms (:mod:`..runs.forms`) and the
schedule forms (:mod:`..schedules.forms`): a one-line name, JSON typed into a box, a
duration; the registered workflows as choices; a runtime error as a form error.

Each field checks what the runtime would refuse, so that an error shows next to the field
that caused it: JSON that does not parse or is of the wrong type, payloads over
``WEFT_MAX_PAYLOAD_BYTES``, NUL and other control characters, durations. The runtime
checks everything again.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms import BoundField

from ...conf import weft_settings
from ...engine import codec
from ...engine.durations import parse_duration
from ...engine.errors import InvalidDuration, PayloadError
from ...engine.registry import registry

MESSAGE_NAME_MAX_LENGTH = 200


def not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def no_control_characters(value: str) -> None:
    """Refuse text with control characters (NUL included): no run name or id holds them."""
    if "\x00" in value:
        return  # Django's own validator of text fields says so
    if any(ord(ch) < 32 for ch in value):
        raise ValidationError("Remove the control characters (such as a tab or a line break).")


class TextField(forms.CharField):
    """A one-line name or id: stripped, at most 200 characters, no control characters."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MESSAGE_NAME_MAX_LENGTH)
        super().__init__(**kwargs)
        self.validators.append(no_control_characters)


class JSONTextField(forms.Field):
    """JSON typed into a textarea: parsed (standard JSON only: no ``NaN``), of the expected
    type, and within ``WEFT_MAX_PAYLOAD_BYTES`` once encoded as it will be stored. An empty
    box is ``empty`` (a fresh copy)."""

    widget = forms.Textarea

    def __init__(
        self, *, expect: type | None = None, empty: Any = None, what: str = "the value", **kwargs: Any
    ) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "widget",
            forms.Textarea(attrs={"rows": 4, "cols": 60, "spellcheck": "false", "class": "weft-json-input"}),
        )
        super().__init__(**kwargs)
        self.expect = expect
        self.empty = empty
        self.what = what

    def to_python(self, value: Any) -> Any:
        text = "" if value is None else str(value).strip()
        if "\x00" in text:
            raise ValidationError("The text contains a NUL character; remove it.")
        if not text:
            return json.loads(json.dumps(self.empty))
        try:
            parsed = json.loads(text, parse_constant=not_a_number)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"This is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from None
        except RecursionError:
            raise ValidationError("This JSON is nested too deeply.") from None
        except ValueError as exc:  # NaN, Infinity
            raise ValidationError(f"This is not valid JSON: {exc}.") from None
        if self.expect is not None and not isinstance(parsed, self.expect):
            wanted: dict[type, str] = {
                list: 'a JSON list, such as [42, "a"]',
                dict: 'a JSON object, such as {"a": 1}',
            }
            raise ValidationError(f"Give {wanted.get(self.expect, self.expect.__name__)}.")
        try:
            codec.dumps(parsed, what=self.what, limit=weft_settings.MAX_PAYLOAD_BYTES)
        except PayloadError as exc:
            raise ValidationError(as_sentence(exc.message)) from None
        return parsed

    def get_bound_field(self, form: forms.BaseForm, field_name: str) -> BoundField:
        return _PayloadBoundField(form, self, field_name)

    def prepare_value(self, value: Any) -> Any:
        # Typed text comes back as typed; an initial value is shown as JSON.
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False)


class _PayloadBoundField(BoundField):
    """A JSON text box that holds at most ``WEFT_MAX_PAYLOAD_BYTES`` characters (read
    live): the browser stops a paste past the limit, instead of the server refusing a
    request body larger than Django takes (``DATA_UPLOAD_MAX_MEMORY_SIZE``) with a bare
    400 page."""

    def build_widget_attrs(self, attrs: dict[str, Any], widget: forms.Widget | None = None) -> dict[str, Any]:
        built = super().build_widget_attrs(attrs, widget)
        built.setdefault("maxlength", str(weft_settings.MAX_PAYLOAD_BYTES))
        return built


class DurationTextField(forms.CharField):
    """A duration: seconds (``90``) or a string such as ``"30s"``, ``"1h30m"``, ``"7d"``."""

    def __init__(self, *, what: str, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("max_length", 100)
        super().__init__(**kwargs)
        self.what = what

    def to_python(self, value: Any) -> str | None:
        text = super().to_python(value)
        if not text:
            return None
        try:
            parse_duration(text, what=self.what)
        except InvalidDuration as exc:
            raise ValidationError(as_sentence(exc.message)) from None
        return text


def as_sentence(message: str) -> str:
    """A runtime error's message as a form shows errors: capitalised, with a full stop."""
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


def workflow_choices() -> list[tuple[str, str]]:
    """The registered workflows, labelled with their parameters after ``ctx``."""
    return [("", "---------")] + [
        (name, f"{name}{_parameters(definition.parameters or inspect.signature(definition.fn))}")
        for name, definition in sorted(registry.workflows.items())
    ]


_STARS: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}


def _parameters(signature: inspect.Signature) -> str:
    """``(order_id: int, express: bool = False)``: the parameters after ``ctx`` as written
    (annotations are often strings, which ``str(signature)`` would quote)."""
    parameters = list(signature.parameters.values())[1:]
    parts: list[str] = []
    starred = False
    for index, parameter in enumerate(parameters):
        kind = parameter.kind
        if kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            parts.append("*")
        starred = starred or kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_POSITIONAL)
        text = f"{_STARS.get(kind, '')}{parameter.name}"
        annotation = parameter.annotation
        if annotation is not inspect.Parameter.empty:
            shown = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", annotation)
            text += f": {shown}"
        if parameter.default is not inspect.Parameter.empty:
            text += f" = {parameter.default!r}"
        parts.append(text)
        following = parameters[index + 1].kind if index + 1 < len(parameters) else None
        if kind is inspect.Parameter.POSITIONAL_ONLY and following is not inspect.Parameter.POSITIONAL_ONLY:
            parts.append("/")
    return f"({', '.join(parts)})"


__all__ = [
    "MESSAGE_NAME_MAX_LENGTH",
    "DurationTextField",
    "JSONTextField",
    "TextField",
    "as_sentence",
    "no_control_characters",
    "not_a_number",
    "workflow_choices",
]
