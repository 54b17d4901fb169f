"""The embedded engine serves a max_model_len beyond the positions its model was trained on, as asked, and says so
in a warning (a coding CLI's first prompt is ~20k tokens; SmolLM2 was trained on 8,192). Shown on the default
checkpoint with its config's max_position_embeddings lowered to 256, so a 300-token prompt runs in a second."""

from __future__ import annotations

import json
import logging

from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig

from .helpers import generate


async def test_a_max_model_len_beyond_the_trained_positions_is_served_with_a_warning(checkpoint, tmp_path,
                                                                                     caplog) -> None:
    model = tmp_path / "short-trained"
    model.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            (model / path.name).symlink_to(path)
    config = json.loads((checkpoint / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(model), max_model_len=512, max_running=1,
                                                 prefix_cache_tokens=0))
    try:
        with caplog.at_level(logging.WARNING):
            facts = await engine.start(lambda: 0)
        assert facts.max_model_len == 512
        assert "max_model_len 512 is beyond the 256 positions" in caplog.text
        result = await generate(engine, list(range(1000, 1300)), max_new_tokens=4, ignore_eos=True)
        assert len(result.tokens) == 4 and result.complete.prompt_tokens == 300
    finally:
        await engine.shutdown()
