"""Method specs: an encoding name with optional options, e.g. ``pape[m=8,form=explicit]``.

The spec string is the method's label in the grid, its directory and its table row, so an
ablation is just another method: ``--methods pape,pape[linear=false],pape[m=2]``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pe_bench.adapters import EncodingFactory, available, get

# Options run to the last "]", so a value may be a YAML list: cape[coordinate_scale=[0.1,0.2]].
_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_.+-]+)(\[(?P<opts>.*)\])?$")


def split_top_level(text: str) -> list[str]:
    """Split at commas outside [...]: "a,b[x=1,y=[2,3]]" -> ["a", "b[x=1,y=[2,3]]"]."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


@dataclass(frozen=True)
class MethodSpec:
    label: str
    name: str
    options: tuple[tuple[str, Any], ...] = ()

    def __hash__(self) -> int:  # the label determines the options; a value may be a list
        return hash(self.label)

    def merged_options(self, task_defaults: dict[str, Any] | None) -> dict[str, Any]:
        """Task-profile defaults for this encoding, overridden by the spec's own options."""
        return {**(task_defaults or {}), **dict(self.options)}

    def encoding(self, task_defaults: dict[str, Any] | None) -> EncodingFactory:
        """The factory backbones build this method's encoding with (task defaults merged)."""
        return EncodingFactory(self.name, self.merged_options(task_defaults))

    def with_options(self, **changes: Any) -> MethodSpec:
        """This spec with ``changes`` added to (or replacing) its options, e.g. PaPE's space
        made explicit: ``parse_method("pape[m=8]").with_options(space="position")`` is
        ``pape[m=8,space=position]``, validated as a spec the user typed would be."""
        options = {**dict(self.options), **changes}
        spec = parse_method(method_label(self.name, options))
        if dict(spec.options) != options:  # a value the label cannot carry (a str YAML reads as another type)
            raise ValueError(f"{self.name}: options {options} do not survive as the label {spec.label!r}")
        return spec


def parse_method(spec: str) -> MethodSpec:
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"bad method spec {spec!r}; expected NAME or NAME[key=value,...]")
    name = match["name"]
    cls = get(name)  # unknown names raise with the registered names and a close match
    options: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in split_top_level(match["opts"] or ""))):
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"bad option {pair!r} in method spec {spec!r}; expected key=value")
        options[key.strip()] = yaml.safe_load(raw)
    try:  # validate now: a bad key or value fails before any training, naming it
        cls.Options(**options)
    except ValidationError as err:
        raise ValueError(option_errors(spec.strip(), name, cls.Options, err)) from None
    return MethodSpec(label=spec.strip(), name=name, options=tuple(sorted(options.items())))


def method_label(name: str, options: dict[str, Any]) -> str:
    """The spec string ``parse_method`` reads back as ``name`` with ``options``:
    ``name[key=value,...]`` in the options' order, values in YAML's flow style without
    spaces (a label is also a directory name), ``name`` alone without options."""
    if not options:
        return name
    return f"{name}[{','.join(f'{key}={_flow(value)}' for key, value in options.items())}]"


def _flow(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"[{','.join(_flow(v) for v in value)}]"
    # YAML's own spelling of a scalar: 1.0e-05 (PyYAML reads 1e-05 as a string), 'true' quoted
    return yaml.safe_dump(value).removesuffix("...\n").strip()


def option_errors(spec: str, name: str, options: type[BaseModel], err: ValidationError) -> str:
    """``pape[mm=3]: unknown option 'mm'; options of pape: m, form, ... (did you mean 'm'?)``,
    one line per problem, instead of pydantic's raw text."""
    valid = list(options.model_fields)
    listing = f"options of {name}: {', '.join(valid) or '(none)'}"
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{spec}: unknown option {key!r}; {listing}{hint}")
        else:
            message = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
            lines.append(f"{spec}: option {key}={e['input']!r}: {message}")
    return "\n".join(lines)


def parse_methods(spec: str) -> list[MethodSpec]:
    """Comma-separated specs (commas inside [...] belong to options); ``all`` = every encoding,
    also next to other specs (``all,pape[m=2]``); a repeated label counts once."""
    parts = split_top_level(spec)
    labels: list[str] = []
    for label in (p.strip() for p in parts if p.strip()):
        labels += available() if label == "all" else [label]
    return [parse_method(label) for label in dict.fromkeys(labels)]
