"""Which JSON-schema keywords the engine enforces exactly, and the schema as xgrammar is given it.

xgrammar 0.2 compiles some keywords without enforcing them: `uniqueItems`, `contains`, `if`/`then`/`else`,
`not`, `dependentRequired`, `multipleOf` on numbers, an `allOf` of several schemas, overlapping `oneOf`
branches, `required` naming a property `properties` does not list, length bounds beside a `pattern` or `format`,
string, number and size keywords without a `type`, `enum`/`const` beside other keywords, formats it does not
know, and `^`/`$` anchors inside a regex (`a^b` matches nothing, xgrammar matches `ab`). A row whose schema
holds one would end normally with an answer that fails its schema, so such a schema is refused for its row,
naming the keyword (`schema_problem`); every other keyword either constrains exactly or only annotates.
Stricter than the schema (and so still valid) are xgrammar's strict mode, which writes no property the schema
does not list, and its full-match `pattern`."""

from __future__ import annotations

import re

from engine.guided_limits import MAX_OPTIONAL_PROPERTIES

UNENFORCED = ("contains", "minContains", "maxContains", "if", "then", "else", "not", "dependentRequired",
              "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef")
FORMATS = ("email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
           "uri-reference", "uri-template", "json-pointer", "relative-json-pointer")
TYPED = ("minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
         "multipleOf", "minItems", "maxItems", "minProperties", "maxProperties")
ANNOTATIONS = ("title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated",
               "readOnly", "writeOnly", "$defs", "definitions", "contentEncoding", "contentMediaType")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "items", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
               type(None): "null"}
_REGEX_ATOMS = re.compile(r"\\.|\[(?:[^\]\\]|\\.)*\]", re.S)


def schema_problem(schema, root=None, where: str = "#") -> str | None:
    """Why xgrammar cannot enforce this schema exactly (naming the keyword and where it is), or None. The
    schema's nesting is bounded (engine/guided_limits.py) before this walk."""
    if not isinstance(schema, dict):
        return None
    root = schema if root is None else root
    problem = _node_problem(schema, root)
    if problem:
        return f"{problem} (at {where})"
    for key, child in _children(schema):
        found = schema_problem(child, root, f"{where}/{key}")
        if found:
            return found
    return None


def _children(schema: dict):
    for name in _SCHEMA_MAPS:
        if isinstance(schema.get(name), dict):
            yield from ((f"{name}/{k}", v) for k, v in schema[name].items())
    for name in _SCHEMA_LISTS:
        if isinstance(schema.get(name), list):
            yield from ((f"{name}/{i}", v) for i, v in enumerate(schema[name]))
    for name in _SCHEMA_ONE:
        if isinstance(schema.get(name), dict):
            yield name, schema[name]


def _node_problem(s: dict, root: dict) -> str | None:
    for name in UNENFORCED:
        if name in s:
            return f"keyword {name} is not enforced while decoding"
    if s.get("uniqueItems") is True:
        return "keyword uniqueItems is not enforced while decoding"
    return (_required_problem(s) or _combination_problem(s, root) or _string_problem(s) or _typed_problem(s)
            or _enum_problem(s) or _size_problem(s))


def _required_problem(s: dict) -> str | None:
    listed = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    missing = [r for r in s.get("required") or [] if r not in listed]
    if missing:
        return (f"keyword required names {missing[0]!r}, which properties does not list (the answer could not "
                "hold it): list it in properties")
    return None


def _combination_problem(s: dict, root: dict) -> str | None:
    if isinstance(s.get("allOf"), list) and len(s["allOf"]) != 1:
        return "keyword allOf with more than one schema is not enforced while decoding: merge them into one"
    if isinstance(s.get("oneOf"), list) and not _disjoint([_resolve(b, root) for b in s["oneOf"]]):
        return ("keyword oneOf with branches that may match the same value is not enforced while decoding: give "
                "branches of different types or with different const values of a required property, or use anyOf")
    types = _types(s)
    if "multipleOf" in s and types is not None and types & {"number"}:
        return "keyword multipleOf on a number is not enforced while decoding: use it with type integer"
    return None


def _string_problem(s: dict) -> str | None:
    fmt = s.get("format")
    if fmt is not None and fmt not in FORMATS:
        return f"format {fmt!r} is not enforced while decoding; supported: {', '.join(FORMATS)}"
    if ("minLength" in s or "maxLength" in s) and ("pattern" in s or "format" in s):
        return ("keywords minLength/maxLength beside pattern or format are not enforced while decoding: put the "
                "length in the pattern")
    if isinstance(s.get("pattern"), str):
        return regex_problem(s["pattern"])
    return None


def _typed_problem(s: dict) -> str | None:
    if "type" in s or "enum" in s or "const" in s:
        return None
    loose = next((k for k in TYPED if k in s), None)
    return f"keyword {loose} without a type is not enforced while decoding: add \"type\"" if loose else None


def _enum_problem(s: dict) -> str | None:
    for name in ("enum", "const"):
        if name not in s:
            continue
        others = sorted(set(s) - {name, "type", *ANNOTATIONS})
        if others:
            return f"keyword {others[0]} beside {name} is not enforced while decoding: list only the allowed values"
        types = _types(s)
        values = s[name] if name == "enum" and isinstance(s[name], list) else [s[name]]
        wrong = next((v for v in values if types is not None and not _fits(v, types)), None)
        if wrong is not None:
            return f"{name} value {wrong!r} is not of type {s['type']}: drop it or fix the type"
    return None


def _size_problem(s: dict) -> str | None:
    listed = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    optional = len(set(listed) - set(s.get("required") or []))
    if optional > MAX_OPTIONAL_PROPERTIES:
        return (f"an object with {optional:,} optional properties; the limit is {MAX_OPTIONAL_PROPERTIES:,} (its "
                "compile time grows with their square): require some, or split the object")
    return None


def regex_problem(pattern: str) -> str | None:
    """Why xgrammar would not match this regex as Python does: an anchor `^` or `$` anywhere but at the start
    or end of the pattern or of one of its alternatives (xgrammar drops it, so `a^b` would match `ab`)."""
    flat = _REGEX_ATOMS.sub("x", pattern)
    for i, ch in enumerate(flat):
        if ch == "^" and i > 0 and not flat[:i].endswith(("(", "|", "(?:")):
            return f"regex {pattern[:80]!r} has an anchor ^ inside it, which is not enforced: anchor only its start"
        if ch == "$" and i < len(flat) - 1 and flat[i + 1] not in ")|":
            return f"regex {pattern[:80]!r} has an anchor $ inside it, which is not enforced: anchor only its end"
    return None


def _types(s: dict) -> set[str] | None:
    t = s.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    return None


def _fits(value, types: set[str]) -> bool:
    kind = _JSON_TYPES.get(type(value))
    return kind in types or (kind == "integer" and "number" in types) or (
        kind == "number" and "integer" in types and float(value).is_integer())


def _resolve(schema, root: dict, hops: int = 8):
    """A local `$ref` ("#/$defs/Name") followed to its schema (a few hops at most)."""
    while hops and isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
        node = root
        for part in schema["$ref"][1:].strip("/").split("/") if schema["$ref"] != "#" else []:
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        schema, hops = node, hops - 1
    return schema


def _branch_types(b) -> set[str] | None:
    if not isinstance(b, dict):
        return None
    types = _types(b)
    if types is None and "const" in b:
        types = {_JSON_TYPES.get(type(b["const"]), "?")}
    if types is None and isinstance(b.get("enum"), list):
        types = {_JSON_TYPES.get(type(v), "?") for v in b["enum"]}
    if types is None and "properties" in b:
        types = {"object"}
    return None if types is None else types | ({"integer"} if "number" in types else set())


def _disjoint(branches: list) -> bool:
    """Whether no value can match two of the branches: their types differ, or both are objects that require
    a property with different const values (a tagged union)."""
    for i, a in enumerate(branches):
        for b in branches[i + 1:]:
            ta, tb = _branch_types(a), _branch_types(b)
            if ta is None or tb is None or (ta & tb and not _tagged_apart(a, b)):
                return False
    return True


def _tagged_apart(a: dict, b: dict) -> bool:
    for name in set(a.get("required") or []) & set(b.get("required") or []):
        ca, cb = (_const(x.get("properties", {}).get(name)) for x in (a, b))
        if ca is not None and cb is not None and ca != cb:
            return True
    return False


def _const(s):
    if isinstance(s, dict) and "const" in s:
        return (s["const"],)
    if isinstance(s, dict) and isinstance(s.get("enum"), list) and len(s["enum"]) == 1:
        return (s["enum"][0],)
    return None
