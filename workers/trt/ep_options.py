"""The TensorRT EP options the pinned onnxruntime-gpu accepts, checked in with their source.

Source: ``onnxruntime-gpu==1.31.1`` (cp311, manylinux_2_28_x86_64), the Python binding
``onnxruntime/capi/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so``: its option
parser's key strings (``strings -n 6 | grep -E '^trt_[a-z0-9_]+$'``: 43 keys) and, for the
booleans, its messages "The value for the key '<key>' should be 'True' or 'False'" (20 keys).
Any other key raises ``Invalid TensorRT EP option``; a boolean given as "1" raises too.
``tests/unit/workers/test_trt.py`` checks every option the runner emits against these lists, and
against the installed binding itself where one is installed.
"""

from __future__ import annotations

ORT_GPU_VERSION = "1.31.1"

ACCEPTED = frozenset({
    "trt_auxiliary_streams", "trt_bf16_enable", "trt_build_heuristics_enable",
    "trt_builder_optimization_level", "trt_context_memory_sharing_enable", "trt_cuda_graph_enable",
    "trt_detailed_build_log", "trt_dla_core", "trt_dla_enable", "trt_dump_ep_context_model",
    "trt_dump_subgraphs", "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix",
    "trt_engine_decryption_enable", "trt_engine_decryption_lib_path", "trt_engine_hw_compatible",
    "trt_ep_context_embed_mode", "trt_ep_context_file_path", "trt_extra_plugin_lib_paths",
    "trt_force_sequential_engine_build", "trt_force_timing_cache", "trt_fp16_enable",
    "trt_int8_calibration_table_name", "trt_int8_enable", "trt_int8_use_native_calibration_table",
    "trt_layer_norm_fp32_fallback", "trt_max_partition_iterations", "trt_max_workspace_size",
    "trt_min_subgraph_size", "trt_onnx_bytestream", "trt_onnx_bytestream_size", "trt_onnx_model_folder_path",
    "trt_op_types_to_exclude", "trt_preview_features", "trt_profile_max_shapes", "trt_profile_min_shapes",
    "trt_profile_opt_shapes", "trt_sparsity_enable", "trt_tactic_sources", "trt_timing_cache_enable",
    "trt_timing_cache_path", "trt_weight_stripped_engine_enable",
})

BOOLEAN = frozenset({
    "trt_bf16_enable", "trt_build_heuristics_enable", "trt_context_memory_sharing_enable",
    "trt_cuda_graph_enable", "trt_detailed_build_log", "trt_dla_enable", "trt_dump_ep_context_model",
    "trt_dump_subgraphs", "trt_engine_cache_enable", "trt_engine_decryption_enable",
    "trt_engine_hw_compatible", "trt_force_sequential_engine_build", "trt_force_timing_cache",
    "trt_fp16_enable", "trt_int8_enable", "trt_int8_use_native_calibration_table",
    "trt_layer_norm_fp32_fallback", "trt_sparsity_enable", "trt_timing_cache_enable",
    "trt_weight_stripped_engine_enable",
})

TRUE, FALSE = "True", "False"  # the binding accepts True/true/False/false only
