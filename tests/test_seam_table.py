"""The seam table in the plugin proto: one entry per `Seam` value, and everything agrees.

The `(agentloop.plugin.v1.seam)` option on each `Seam` value is the one declaration;
the server's remote listeners, the Python SDK and the Node helper read it. These
tests check it against the server's seam names, the payload oneofs and the SDK.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentloop.plugin import sdk
from agentloop.plugin.seam_table import BY_PAYLOAD, BY_SEAM, SPECS
from agentloop.plugin.v1 import hook_service_pb2 as hk
from server.kernel import seams as S
from server.plugins import codecs, listeners
from server.plugins import modes as pl
from tests import seam_table

ROOT = Path(__file__).resolve().parent.parent

SEAM_KEYS = {
    value.path: value
    for name, value in vars(S).items()
    if name.isupper() and isinstance(value, S.SeamKey)
}
"""The seam keys of `server/kernel/seams.py`, by path."""
SEAM_PATHS = set(SEAM_KEYS)


def test_every_seam_value_has_exactly_one_entry() -> None:
    numbers = [v.number for v in hk.Seam.DESCRIPTOR.values if v.number != hk.SEAM_UNSPECIFIED]
    assert sorted(spec.seam for spec in SPECS) == sorted(numbers)
    assert len(BY_SEAM) == len(SPECS) == len(BY_PAYLOAD)
    assert len({spec.path for spec in SPECS}) == len(SPECS)
    assert len({spec.method for spec in SPECS}) == len(SPECS)
    unspecified = hk.Seam.DESCRIPTOR.values_by_number[hk.SEAM_UNSPECIFIED].GetOptions()
    assert not unspecified.HasExtension(hk.seam)


def test_each_entry_names_a_server_seam_and_the_payload_oneofs() -> None:
    call_payloads = {f.name for f in hk.HookCall.DESCRIPTOR.oneofs_by_name["payload"].fields}
    outcomes = {f.name for f in hk.HookResult.DESCRIPTOR.oneofs_by_name["outcome"].fields}
    for spec in SPECS:
        assert spec.path in SEAM_PATHS, spec
        assert spec.mode != hk.SEAM_MODE_UNSPECIFIED, spec
        assert spec.payload in call_payloads, spec
        if spec.mode == hk.SEAM_MODE_OBSERVER:
            assert spec.decision is None and spec.payload not in outcomes, spec
        else:
            assert spec.payload in outcomes, spec
            field = hk.HookResult.DESCRIPTOR.fields_by_name[spec.payload]
            assert spec.decision is not None and field.message_type is not None
            assert spec.decision.DESCRIPTOR.full_name == field.message_type.full_name


def test_server_dispatch_follows_the_table() -> None:
    assert {spec.seam: spec.path for spec in SPECS} == listeners.SEAM_NAMES
    assert sorted(codecs.CODECS) == sorted(spec.path for spec in SPECS)
    adapters: dict[int, tuple[type, ...]] = {
        hk.SEAM_MODE_WATERFALL: (pl.Transform, pl.Wrap),
        hk.SEAM_MODE_SERIAL: (pl.Check,),
        hk.SEAM_MODE_OBSERVER: (pl.Watch,),
        hk.SEAM_MODE_APPROVER: (pl.Approve,),
    }
    keys: dict[int, type[S.SeamKey]] = {
        hk.SEAM_MODE_WATERFALL: S.Waterfall,
        hk.SEAM_MODE_SERIAL: S.Serial,
        hk.SEAM_MODE_OBSERVER: S.Emit,
        hk.SEAM_MODE_APPROVER: S.Gather,
    }
    for spec in SPECS:
        codec = codecs.CODECS[spec.path]
        assert isinstance(codec, adapters[spec.mode]), spec
        assert codec.key is SEAM_KEYS[spec.path], spec
        assert isinstance(codec.key, keys[spec.mode]), spec


def test_python_sdk_has_each_registration_method() -> None:
    for spec in SPECS:
        plugin = sdk.Plugin("t")

        async def handler(call: hk.HookCall) -> None:
            return None

        getattr(plugin, spec.method)()(handler)
        (subscription,) = plugin.describe().subscriptions
        assert subscription.seam == spec.seam, spec


def test_the_python_sdk_subscribes_to_any_seam_of_the_table_by_path_or_value() -> None:
    async def handler(call: hk.HookCall) -> None:
        return None

    for spec in SPECS:
        for seam in (spec.path, spec.seam):
            plugin = sdk.Plugin("t")
            plugin.on(seam)(handler)
            (subscription,) = plugin.describe().subscriptions
            assert subscription.seam == spec.seam, (seam, spec)
    with pytest.raises(ValueError, match="no seam 'agent/nowhere'"):
        sdk.Plugin("t").on("agent/nowhere")


def test_the_node_helper_subscribes_to_any_seam_of_the_table_by_path_or_name() -> None:
    script = (
        "const { Plugin } = require('./plugin.js');"
        "const { SEAMS } = require('./proto.js');"
        "const out = [];"
        "for (const s of SEAMS) for (const key of [s.path, s.seam]) {"
        "  const p = new Plugin({ name: 't' }); p.on(key, () => undefined);"
        "  out.push([key, [...p.subscriptions.keys()]]); }"
        "let refused = '';"
        "try { new Plugin({ name: 't' }).on('agent/nowhere', () => undefined); }"
        "catch (e) { refused = e.message; }"
        "console.log(JSON.stringify({ out, refused }));"
    )
    out = subprocess.run(
        ["node", "-e", script], cwd=ROOT / "clients" / "node", capture_output=True, check=True
    )
    found = json.loads(out.stdout)
    camel = lambda name: "".join(  # noqa: E731
        part if i == 0 else part.capitalize() for i, part in enumerate(name.split("_"))
    )
    keys = [(spec, key) for spec in SPECS for key in (spec.path, hk.Seam.Name(spec.seam))]
    assert found["out"] == [[key, [camel(spec.payload)]] for spec, key in keys]
    assert "no seam agent/nowhere" in found["refused"]


def test_node_helper_reads_the_same_table() -> None:
    script = "console.log(JSON.stringify(require('./proto.js').SEAMS))"
    out = subprocess.run(
        ["node", "-e", script], cwd=ROOT / "clients" / "node", capture_output=True, check=True
    )
    seams = json.loads(out.stdout)
    camel = lambda name: "".join(  # noqa: E731
        part if i == 0 else part.capitalize() for i, part in enumerate(name.split("_"))
    )
    assert seams == [
        {
            "method": camel(spec.method),
            "seam": hk.Seam.Name(spec.seam),
            "path": spec.path,
            "payload": camel(spec.payload),
            "answered": spec.mode != hk.SEAM_MODE_OBSERVER,
        }
        for spec in SPECS
    ]


def test_node_helper_has_each_registration_method() -> None:
    script = (
        "const { Plugin } = require('./plugin.js');"
        "const { SEAMS } = require('./proto.js');"
        "console.log(JSON.stringify(SEAMS.filter("
        "(s) => typeof Plugin.prototype[s.method] !== 'function').map((s) => s.method)))"
    )
    out = subprocess.run(
        ["node", "-e", script], cwd=ROOT / "clients" / "node", capture_output=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_readme_seam_table_is_the_one_the_proto_declares() -> None:
    readme = seam_table.README.read_text(encoding="utf-8")
    assert seam_table.committed(readme) == seam_table.table(), (
        "proto/README.md's seam table is stale: run `python -m tests.seam_table --write`"
    )


def test_the_generated_table_has_a_row_per_seam_naming_its_option() -> None:
    rows = seam_table.table().splitlines()[2:]
    assert len(rows) == len(SPECS)
    for row, spec in zip(rows, SPECS, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[:2] == [f"`{hk.Seam.Name(spec.seam)}`", f"`{spec.path}`"], row
        assert cells[3] == f"`{spec.method}`", row
        assert cells[4].startswith(f"`{spec.payload}`: "), row


def test_writing_the_table_replaces_only_what_is_between_the_markers() -> None:
    stale = f"before\n{seam_table.BEGIN}\n| old | table |\n{seam_table.END}\nafter\n"
    fresh = seam_table.written(stale)
    assert fresh == f"before\n{seam_table.BEGIN}\n{seam_table.table()}\n{seam_table.END}\nafter\n"
    assert seam_table.committed(fresh) == seam_table.table()
    assert seam_table.written(fresh) == fresh
