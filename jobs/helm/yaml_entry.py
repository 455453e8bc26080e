"""One entry of a list in a user's YAML file (HELM's `model_deployments.yaml` and its siblings), replaced or added by
editing the file's text: the rest of the file (comments, quoting, order, the other entries) stays as written.

The file is read with PyYAML's composer, whose nodes know where they start and end in the text. An entry of the
same `name` is replaced where it stands; a new one goes after the list's last entry, in the list's style (block
entries indented as the others, or JSON in a flow list). The result is parsed again and must hold the entry and
every other value unchanged, or nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from jobs.helm.errors import SpecError


def set_list_entries(edits: list[tuple[Path, str, dict]]) -> None:
    """For each (path, section, entry): replace (by `name`) or add `entry` in the list `section` of the YAML file
    at `path` (made if missing). Every file is checked before any is written."""
    texts = []
    for path, section, entry in edits:
        try:
            text = Path(path).read_text() if Path(path).is_file() else ""
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"cannot read {path} ({type(e).__name__}); fix or move the file away") from e
        texts.append((Path(path), text, with_entry(text, section, entry, path)))
    for path, text, new in texts:
        if new != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(new)
            tmp.replace(path)


def with_entry(text: str, section: str, entry: dict, where) -> str:
    """`text` with `entry` replaced or added in the list `section`."""
    import yaml

    root = _compose(text, where)
    if root is None:
        return text + ("\n" if text and not text.endswith("\n") else "") + _dump({section: [entry]})
    if not isinstance(root, yaml.MappingNode):
        raise SpecError(f"{where} is not a mapping of sections ({section}: ...); fix it or move it away")
    value = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == section), None)
    if value is None:
        new = text + ("\n" if text and not text.endswith("\n") else "") + _dump({section: [entry]})
    elif isinstance(value, yaml.ScalarNode) and value.tag == "tag:yaml.org,2002:null":
        key = next(k for k, v in root.value if v is value)
        colon = text.index(":", key.end_mark.index) + 1
        end = value.end_mark.index if value.end_mark.index > value.start_mark.index else colon
        new = text[:colon] + "\n- " + _block(entry, 2) + text[end:]
    elif isinstance(value, yaml.SequenceNode):
        new = _in_list(text, value, entry)
    else:
        raise SpecError(f"{where}: {section} is not a list; make it a list of entries (`- name: ...`)")
    _check(text, new, section, entry, where)
    return new


def _compose(text: str, where):
    import yaml

    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise SpecError(f"{where} is not valid YAML ({' '.join(str(e).split())}); fix its syntax or move the file "
                        "away") from e


def _in_list(text: str, seq, entry: dict) -> str:
    import yaml

    items = seq.value
    same = next((item for item in items if isinstance(item, yaml.MappingNode) and any(
        isinstance(k, yaml.ScalarNode) and k.value == "name" and getattr(v, "value", None) == entry["name"]
        for k, v in item.value)), None)
    if seq.flow_style:
        if same is not None:
            return text[:same.start_mark.index] + json.dumps(entry) + text[same.end_mark.index:]
        close = seq.end_mark.index - 1  # the list's closing bracket
        return text[:close] + (", " if items else "") + json.dumps(entry) + text[close:]
    if same is not None:
        return text[:same.start_mark.index] + _block(entry, same.start_mark.column) + text[_end(same):]
    last = items[-1]
    dash = text.rfind("-", 0, last.start_mark.index)
    column = dash - (text.rfind("\n", 0, dash) + 1)
    at = _end(last)
    return text[:at] + "\n" + " " * column + "- " + _block(entry, column + 2) + text[at:]


def _end(node) -> int:
    """Where a block node's own text ends: after its last scalar (PyYAML's end of a block collection is the next
    token, past any comments that follow it)."""
    import yaml

    if isinstance(node, yaml.MappingNode) and node.value and not node.flow_style:
        return _end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and node.value and not node.flow_style:
        return _end(node.value[-1])
    return node.end_mark.index


def _dump(data) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1 << 16)


def _block(entry: dict, column: int) -> str:
    """`entry` as a block mapping whose first line starts at `column` (no indent) and the others under it."""
    lines = _dump(entry).rstrip("\n").split("\n")
    return "\n".join([lines[0]] + [" " * column + line for line in lines[1:]])


def _check(old: str, new: str, section: str, entry: dict, where) -> None:
    """The edit changed nothing but the entry: else the file is left as it was, and the entry is shown."""
    import yaml

    before, after = yaml.safe_load(old) or {}, yaml.safe_load(new)
    others = [e for e in before.get(section) or [] if not (isinstance(e, dict) and e.get("name") == entry["name"])]
    kept = [e for e in after.get(section) or [] if not (isinstance(e, dict) and e.get("name") == entry["name"])]
    ours = [e for e in after.get(section) or [] if isinstance(e, dict) and e.get("name") == entry["name"]]
    if ({k: v for k, v in after.items() if k != section} != {k: v for k, v in before.items() if k != section}
            or kept != others or ours[:1] != [entry]):
        raise SpecError(f"{where}: cannot add the entry {entry['name']} to {section} without rewriting the file; "
                        f"add it by hand: {json.dumps(entry)}")
