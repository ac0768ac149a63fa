"""What each value of an exporter's ``genai_config.json`` may be, as data (``farm.core.jsonspec``),
for every layout ``farm.core.genai`` maps (Olive's and AI Hub's decoder pipelines), and what the
tokenizer files it carries must be.

The keys are onnxruntime-genai's (its ``config.cpp``): the farm reads some of them (the stages,
``context_length``, ``search.max_length``, ``sliding_window``, ``pad_token_id``) and carries the
rest into the folder it ships, where ``og.Config`` reads them; so each is checked here, with
its JSON type and range, before anything is compiled. A stage object is closed (onnxruntime-genai
refuses a key it does not know there, and the farm copies each one); the other sections accept
keys this ctxfarm does not know (a newer exporter's), whatever their value. ``null`` is accepted
where exporters write it for what they did not know (the generated config leaves it out).
"""

from __future__ import annotations

import re
from typing import Any

from farm.core.jsonspec import Anything, Arr, Bool, Either, Int, Null, Num, Obj, Str, check

MAX_CONTEXT = 1 << 24    # tokens: a KV cache, a max_length
MAX_STAGES = 2 * 64 + 16
FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
STAGE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
FILE_NAME = ("a plain file name in the export folder (letters, digits, '_', '.', '+', '-', no directory, no "
             "leading dot)")

TOKEN = Int(0, (1 << 31) - 1)
COUNT = Int(1, 1 << 20)
THREADS = Int(0, 4096)
TEXT = Str(1024)
OPTION_VALUE = Either((TEXT, Int(-(1 << 63), (1 << 63) - 1), Bool()), "a string, an integer or true/false")

PROVIDER_OPTIONS = Arr(Obj(other=Obj({"device_filtering_options": Obj(other=Anything())}, other=OPTION_VALUE,
                                     max_keys=128), max_keys=8), max_len=16)
SESSION_OPTIONS = Obj({
    "log_id": TEXT, "enable_profiling": TEXT, "custom_ops_library": TEXT,
    "intra_op_num_threads": THREADS, "inter_op_num_threads": THREADS,
    "log_severity_level": Int(0, 4), "log_verbosity_level": Int(0, 1 << 16),
    "enable_cpu_mem_arena": Bool(), "enable_mem_pattern": Bool(),
    "graph_optimization_level": Str(choices=("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED",
                                             "ORT_ENABLE_ALL")),
    "provider_options": PROVIDER_OPTIONS,
}, other=TEXT, max_keys=128)  # any other key is a session config entry: a string

IO_NAMES = Arr(Str(4096), max_len=4096)
STAGE = Obj({
    "filename": Str(128, FILE_NAME_RE, FILE_NAME),
    "inputs": IO_NAMES, "outputs": IO_NAMES,
    "session_options": SESSION_OPTIONS,
    "run_options": Obj(other=TEXT, max_keys=128),
    "output_names_forwarder": Obj(other=Str(4096), max_keys=4096),
    "run_on_prompt": Bool(), "run_on_token_gen": Bool(), "is_lm_head": Bool(), "inherit_session_options": Bool(),
    "reset_session_idx": Int(-1, MAX_STAGES),
}, required=("filename",))

DECODER = Obj({
    "filename": Null(Str(128)),
    "session_options": SESSION_OPTIONS,
    "hidden_size": Null(COUNT), "num_attention_heads": Null(COUNT), "num_key_value_heads": Null(COUNT),
    "num_hidden_layers": Null(COUNT), "head_size": Null(COUNT),
    "inputs": Obj(other=Str(4096), max_keys=128), "outputs": Obj(other=Str(4096), max_keys=128),
    "sliding_window": Obj({
        "window_size": Int(1, MAX_CONTEXT), "pad_value": Int(-(1 << 31), (1 << 31) - 1),
        "alignment": Str(choices=("left", "right")), "slide_key_value_cache": Bool(), "slide_inputs": Bool(),
    }, other=Anything()),
    "pipeline": Arr(Obj(other=STAGE, max_keys=MAX_STAGES, key_pattern=STAGE_NAME_RE,
                        key_what="a stage name (letters, digits, '_', '.', '-', at most 64)"), 1, 1),
}, required=("pipeline",), other=Anything())

MODEL = Obj({
    "type": Str(64),
    "bos_token_id": Null(TOKEN), "pad_token_id": Null(Int(-1, (1 << 31) - 1)), "sep_token_id": Null(TOKEN),
    "decoder_start_token_id": Null(TOKEN),
    "eos_token_id": Null(Either((TOKEN, Arr(TOKEN, 1, 64)), "a token id or a list of 1 to 64 token ids")),
    "vocab_size": Null(Int(1, MAX_CONTEXT)),
    "context_length": Null(Int(1, MAX_CONTEXT)),
    "decoder": DECODER,
}, required=("type", "decoder"), other=Anything())

SEARCH = Obj({
    "max_length": Null(Int(1, MAX_CONTEXT)), "min_length": Null(Int(0, MAX_CONTEXT)),
    "batch_size": Null(Int(1, 4096)), "num_beams": Null(Int(1, 256)), "num_return_sequences": Null(Int(1, 256)),
    "top_k": Null(Int(0, MAX_CONTEXT)), "top_p": Null(Num(0, 1)), "temperature": Null(Num(0, 1e6)),
    "repetition_penalty": Null(Num(0, 1e6)), "length_penalty": Null(Num(-1e6, 1e6)),
    "diversity_penalty": Null(Num(-1e6, 1e6)), "no_repeat_ngram_size": Null(Int(0, MAX_CONTEXT)),
    "early_stopping": Null(Bool()), "do_sample": Null(Bool()), "past_present_share_buffer": Null(Bool()),
    "random_seed": Null(Int(-1, (1 << 63) - 1)),
}, other=Anything())

GENAI_CONFIG = Obj({"model": MODEL, "search": Null(SEARCH)}, required=("model",), other=Anything())

# The tokenizer files that are JSON (the others, tokenizer.model, merges.txt, a .jinja, are carried
# as bytes): each must parse as an object; tokenizer.json is a Hugging Face tokenizers file.
TOKENIZER_JSON = {
    "tokenizer.json": Obj({"model": Obj(other=Anything())}, required=("model",), other=Anything(),
                          max_keys=4096),
    **{name: Obj(other=Anything(), max_keys=1 << 22) for name in
       ("tokenizer_config.json", "special_tokens_map.json", "vocab.json", "added_tokens.json",
        "generation_config.json")},
}


def check_config(doc: Any) -> None:
    """Raise ``farm.core.jsonspec.SpecError`` naming the first value of a parsed genai_config.json
    that is not what onnxruntime-genai and the farm take."""
    check(doc, GENAI_CONFIG)
