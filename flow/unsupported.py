"""OneFlow 0.3 names flowc knows of and does not support: one table, name -> why.

Each name is bound where OneFlow has it (`flow.user_op_builder`, `flow.data.ofrecord_reader`, ...) to a
function that raises `flow.UnsupportedError` naming the feature when called, so a program fails at the
call with a reason, never with an AttributeError.  docs and the compatibility table read `UNSUPPORTED`.

Example:
    flow.data.ofrecord_reader("/data/imagenet", batch_size=32)
    # UnsupportedError: flow.data.ofrecord_reader is not supported by flowc: OFRecord files ...
"""
from __future__ import annotations

from typing import Any, Callable, NoReturn

from flowc.compiler.errors import UnsupportedError
from flowc.compiler.trace import user_location

_OFRECORD = ("OFRecord datasets and their decoders are not supported yet (a later issue); feed NumPy arrays "
             "through tp.Numpy.Placeholder parameters instead, e.g. from flow.data.load_mnist")
_IMAGE = "image ops work on OFRecord tensor buffers, which flowc does not support yet; decode images with NumPy"
_CUSTOM_OPS = ("custom C++ ops need OneFlow's op registry and runtime; flowc compiles its own op set "
               "(see docs/oneflow_compat.md)")

_DYNAMIC = ("the shape of its result depends on the values it is given; flowc compiles every shape ahead of "
            "the step (see docs/dynamic_inputs.md for inputs smaller than declared)")
_SEVERAL_DEVICES = ("it works across devices or machines outside the job's own collectives; flowc's ranks meet "
                    "only in the collectives its passes plan (docs/distributed.md)")
_DETECTION = ("an object-detection op of OneFlow's Mask R-CNN models (boxes, anchors, polygons); not in flowc's "
              "op set")
_TENSOR_BUFFER = ("tensor buffers and tensor lists hold tensors of different shapes in one blob; flowc's blobs "
                  "have one static shape (tp.ListListNumpy inputs are joined along axis 0)")
_INTERNAL = "an internal of OneFlow's runtime or graph builder, with no counterpart in flowc"
_NOT_YET = "not implemented in flowc yet"
_NO_LIBRARY = "flowc has no C++ library to build custom ops against (see docs/oneflow_compat.md)"
_SUMMARY = "OneFlow's TensorBoard summary writer; record values with flow.watch or job results instead"
_UNITTEST = "OneFlow's own test harness; flowc's tests use pytest"
_MICRO_BATCHES = ("OneFlow's micro-batch ops run part of a job several times within one step (repeat, pack) and "
                  "join the passes (acc, unpack); a flowc step runs its graph once: feed the whole batch, or "
                  "accumulate results over calls")
_QUANTIZATION = ("quantization-aware training (observers and fake quantization) is not in flowc's op set; "
                 "FunctionConfig.enable_qat is refused too")

# Fully qualified name (under `flow.`) -> reason.
UNSUPPORTED: dict[str, str] = {
    "user_op_module_builder": _CUSTOM_OPS,
    "config.load_library": _CUSTOM_OPS,
    "config.load_library_now": _CUSTOM_OPS,
    "enable_eager_execution": "eager execution: flowc compiles job functions (lazy mode) only",
    **{f"data.{name}": _OFRECORD for name in (
        "ofrecord_reader", "OFRecordRawDecoder", "ofrecord_raw_decoder", "OFRecordBytesDecoder",
        "ofrecord_bytes_decoder", "OFRecordImageDecoder", "ofrecord_image_decoder",
        "OFRecordImageDecoderRandomCrop", "ofrecord_image_decoder_random_crop", "ofrecord_loader",
        "ofrecord_image_classification_reader", "onerec_reader", "decode_ofrecord", "decode_random",
        "ImagePreprocessor", "ImageResizePreprocessor", "NormByChannelPreprocessor", "ImageCodec", "RawCodec",
        "BytesListCodec", "BlobConf", "image_decoder_random_crop_resize", "ImageDecoderRandomCropResize",
        "coco_reader", "COCOReader", "megatron_gpt_mmap_data_loader", "MegatronGPTMMapDataLoader")},
    "consistent_user_op_module_builder": _CUSTOM_OPS,
    "builtin_op": _CUSTOM_OPS,
    **{name: _DYNAMIC for name in ("argwhere", "nonzero", "dynamic_reshape", "sync_dynamic_resize",
                                    "dim0_dynamic_to_fixed")},
    **{name: _SEVERAL_DEVICES for name in ("eager_nccl_all_reduce", "distributed_partial_fc_sample",
                                            "deprecated.init_worker", "deprecated.delete_worker",
                                            "deprecated.delete_worker_by_bootstrap")},
    **{f"detection.{name}": _DETECTION for name in (
        "affine_channel", "anchor_generate", "box_decode", "box_encode", "calc_iou_matrix", "clip_to_image",
        "extract_piece_slice_id", "identify_non_small_boxes", "identify_outside_anchors", "level_map",
        "maskrcnn_positive_negative_sample", "maskrcnn_split", "nms", "object_bbox_flip", "object_bbox_scale",
        "object_segmentation_polygon_flip", "object_segmentation_polygon_scale",
        "object_segmentation_polygon_to_mask", "pos_neg_sampler", "roi_align", "smooth_l1", "upsample_nearest")},
    **{name: _DETECTION for name in (
        "object_bbox_flip", "object_bbox_scale", "object_segmentation_polygon_flip",
        "object_segmentation_polygon_scale", "object_segmentation_polygon_to_mask", "layers.affine_channel")},
    **{name: _IMAGE for name in ("image_batch_align", "image_decode", "image_flip", "image_normalize",
                                  "image_random_crop", "image_resize", "image_target_resize")},
    **{name: _TENSOR_BUFFER for name in ("tensor_buffer", "tensor_buffer_to_tensor", "tensor_buffer_to_tensor_list",
                                          "tensor_list_split", "tensor_list_to_tensor_buffer",
                                          "tensor_to_tensor_buffer")},
    "record": _OFRECORD,
    "data.OneRecDecoder": _OFRECORD,
    "data.onerec_decoder": _OFRECORD,
    "onerec.decode_onerec": _OFRECORD,
    "onerec.FieldConf": _OFRECORD,
    **{name: _INTERNAL for name in ("current_resource", "current_scope", "find_or_create_module",
                                     "inter_job_reuse_mem_strategy", "pad_grad", "layers.layer_norm_grad",
                                     "layers.layer_norm_param_grad", "placement.current_scope", "scope.current_scope",
                                     "same_padding", "sleep_identity", "math.reduced_shape_elem_cnt")},
    **{name: _NOT_YET for name in (
        "categorical_ordinal_encode", "layers.categorical_ordinal_encoder", "ctc_loss", "diag",
        "nn.random_mask_like", "nn.unfold1d", "nn.unfold2d", "nn.unfold3d")},
    **{name: _MICRO_BATCHES for name in ("repeat", "acc", "pack", "unpack")},
    "optimizer.CombinedOptimizer": "several optimizers over disjoint variables in one job; give each optimizer "
                                   "its `variables` in a train job of its own",
    "optimizer.CustomScheduler": "a learning rate read from a blob by its logical blob name; flowc has no logical "
                                 "blob names: use one of the schedulers",
    "env.current_resource": _INTERNAL,
    **{f"sysconfig.{name}": _NO_LIBRARY for name in (
        "get_compile_flags", "get_include", "get_lib", "get_link_flags", "has_rpc_backend_grpc",
        "has_rpc_backend_local", "with_cuda", "with_xla")},
    **{f"summary.{name}": _SUMMARY for name in ("create_summary_writer", "flush_summary_writer", "histogram",
                                                "image", "pb", "scalar", "text", "hparams", "Hparam",
                                                "IntegerRange", "RealRange", "ValueSet", "Metric", "Graph",
                                                "Projector")},
    **{f"quantization.{name}": _QUANTIZATION for name in ("fake_quantization", "min_max_observer",
                                                         "moving_average_min_maxObserver")},
    **{f"unittest.{name}": _UNITTEST for name in (
        "num_nodes_required", "register_test_cases", "TestCase", "TestCase_1n1d", "skip_unless_1n1d",
        "skip_unless_1n2d", "skip_unless_1n4d", "skip_unless_2n1d", "skip_unless_2n2d", "skip_unless_2n4d",
        "env.eager_execution_enabled",
        "env.gpu_device_num", "env.has_node_list", "env.node_list", "env.node_size", "env.typing_check_enabled")},
    **{f"image.{name}": _IMAGE for name in (
        "Resize", "resize", "CropMirrorNormalize", "crop_mirror_normalize", "decode", "target_resize",
        "batch_align", "normalize", "flip", "random_crop")},
}


def _feature_error(qualified: str) -> UnsupportedError:
    return UnsupportedError(f"{user_location()}: flow.{qualified} is not supported by flowc: "
                            f"{UNSUPPORTED[qualified]}")


def stub(qualified: str) -> Callable[..., NoReturn]:
    """The function bound to an unsupported name: raises UnsupportedError naming it when called."""
    if qualified not in UNSUPPORTED:
        raise KeyError(qualified)

    def unsupported(*args: Any, **kwargs: Any) -> NoReturn:
        raise _feature_error(qualified)
    unsupported.__name__ = unsupported.__qualname__ = qualified.rsplit(".", 1)[-1]
    unsupported.__doc__ = f"Not supported by flowc: {UNSUPPORTED[qualified]}"
    return unsupported


def stubs(namespace: str) -> dict[str, Callable[..., NoReturn]]:
    """Stubs for every unsupported name directly under `flow.<namespace>` ("" for `flow` itself)."""
    prefix = f"{namespace}." if namespace else ""
    return {name[len(prefix):]: stub(name) for name in UNSUPPORTED
            if name.startswith(prefix) and "." not in name[len(prefix):]}


# Namespaces of OneFlow that hold only unsupported names: flow/__init__.py makes each a module of stubs.
UNSUPPORTED_NAMESPACES = ("detection", "onerec", "summary", "sysconfig", "unittest", "unittest.env", "placement",
                          "quantization")


def namespace_module(namespace: str, package: str = "flow"):
    """A module `flow.<namespace>` whose names are the stubs of that namespace (sub-namespaces included)."""
    import sys
    import types
    module = types.ModuleType(f"{package}.{namespace}", f"OneFlow's flow.{namespace}: not supported by flowc "
                                                         "(flow/unsupported.py names why).")
    for name, fn in stubs(namespace).items():
        setattr(module, name, fn)
    sys.modules[module.__name__] = module
    return module


def accepted(reason: str):
    """Mark a function flowc accepts without effect (a setting or marker with no meaning here): the
    compatibility table (docs/oneflow_compat.md) lists it as "accepted (no-op)" with `reason`."""
    def mark(fn):
        fn.__flowc_no_op__ = reason
        return fn
    return mark
