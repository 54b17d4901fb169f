"""`agentloop rollout` over a dataset with pictures, on the embedded engine serving the tiny VLM: the dataset row of
docs/multimodal.md (and the README) with the YAML of that page, run as written but for the model's path. The
picture means nothing to the model (its vision part is random); the run checks where its ids go and what is kept."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentloop_grpc.common.media import ImageExpander, decode_image

from .pictures import png

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "multimodal.md"


def _block(lang: str) -> str:
    found = re.search(rf"^```{lang}\n(.*?)^```", DOC.read_text(), re.M | re.S)
    assert found, f"docs/multimodal.md has no {lang} block"
    return found.group(1)


def test_rollout_of_the_documented_dataset_with_pictures(tiny_vlm, tmp_path):
    import pyarrow.parquet as pq

    row = _block("json").strip()
    config = yaml.safe_load(_block("yaml"))
    config["engines"]["launch"]["engine"]["model"] = str(tiny_vlm)
    config["output_dir"] = str(tmp_path / "out")
    picture = png((255, 0, 0))
    (tmp_path / "red.png").write_bytes(picture)
    (tmp_path / config["dataset"]["path"]).write_text(row + "\n")
    (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "rollout", "--config", "rollout.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = pq.read_table(tmp_path / "out" / "trajectories.parquet").to_pylist()
    assert len(rows) == config["samples_per_prompt"]
    expansion = ImageExpander.load(str(tiny_vlm)).expand(decode_image(picture, "image/png")).ids
    for t in rows:
        assert t["error"] is None and t["loop"] == "single_turn" and t["response_mask"] == [1] * len(t["response_ids"])
        [image] = t["media"]
        assert image["data"] == picture and image["mime_type"] == "image/png"
        assert tuple(t["prompt_ids"][image["offset"]:image["offset"] + image["length"]]) == expansion
        assert json.loads(t["messages"])[0]["content"] == [
            {"type": "image", "media": 0}, {"type": "text", "text": "What colour is this picture?"}]
    assert "data:image/png;base64," in (tmp_path / "out" / "report.html").read_text()
