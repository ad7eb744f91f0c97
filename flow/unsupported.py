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

# Fully qualified name (under `flow.`) -> reason.
UNSUPPORTED: dict[str, str] = {
    "user_op_builder": _CUSTOM_OPS,
    "consistent_user_op_builder": _CUSTOM_OPS,
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
