"""LLM export folders for genai tests: ``bench/genai_export.py`` run as a user runs it (a tiny
random-weight Llama-shaped decoder, Olive's or AI Hub's layout), and a weight-shared package
assembled from it as the farm ships it (each part one real QNN group compile)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--hidden", "64", "--layers", "2", "--window", "16", "--context", "64")


def make_export(out: Path, *args: str) -> Path:
    """``python bench/genai_export.py OUT --parts 2 ...`` (small unless ``args`` say otherwise)."""
    argv = [sys.executable, str(ROOT / "bench" / "genai_export.py"), str(out), "--parts", "2", *SMALL, *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return out


def edit_config(folder: Path, change: Any) -> None:
    """Apply ``change(doc)`` to ``folder/genai_config.json`` (keeping the stages' order)."""
    path = folder / "genai_config.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


def relink(ctx: Path, renamed: dict[str, str], out: Path) -> None:
    """``ctx`` written to ``out`` with its EPContext nodes pointing at ``renamed``'s binaries."""
    import onnx

    model = onnx.load(str(ctx), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "EPContext" and a.name == "ep_cache_context" and a.s.decode() in renamed:
                a.s = renamed[a.s.decode()].encode()
    onnx.save_model(model, str(out))


def build_package(export_dir: Path, out: Path, *, soc_model: str = "57") -> Path:
    """The folder a device gets, laid out as the farm ships it (farm.core.genai.package_layout:
    ``context_0_ctx.onnx``, ``iterator_0_ctx.onnx``, ``context_0_ctx_qnn.bin``...): each part's
    prefill and decode compiled as one weight-shared group (workers.qnn.child compile_group, as
    the QNN runner runs it), the binary renamed and the context models relinked to it, the CPU
    stages and tokenizer copied, the generated genai_config.json."""
    from farm.core import genai
    from workers.runner import run_child

    export = genai.read_export(export_dir)
    layout = genai.package_layout(export)
    for d in (out, out.parent / "groups"):
        if d.exists():
            shutil.rmtree(d)
    out.mkdir(parents=True)
    for p in export.parts:
        group = out.parent / "groups" / f"part{p.index}"
        group.mkdir(parents=True)
        members = [{"model": path, "ctx_path": str(group / f"g{i}_ctx.onnx"), "stop": i == 1}
                   for i, (_, path) in enumerate(export.group_members(p.index))]
        run_child("workers.qnn.child", "compile_group",
                  {"group": members, "out_dir": str(group),
                   "provider_options": {"soc_model": soc_model, "htp_graph_finalization_optimization_mode": "0"}},
                  group, timeout=300)
        (binary,) = sorted(b.name for b in group.glob("*.bin"))
        renamed = {binary: genai.part_binary(export, p.index)}
        shutil.copy2(group / binary, out / renamed[binary])
        for i, stage in enumerate((p.prefill, p.decode)):
            relink(group / f"g{i}_ctx.onnx", renamed, out / layout[stage.name])
    for f in export.carried_files():
        shutil.copy2(export.path(f), out / f)
    (out / genai.CONFIG_FILE).write_bytes(genai.config_bytes(genai.genai_config(export, layout)))
    return out
