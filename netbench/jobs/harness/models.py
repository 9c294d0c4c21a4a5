"""The models a job can train, and their size (Keras 3; no downloads).

The pure part (names, default input shapes, shape parsing) imports no TensorFlow, so
the controller and the CLI can validate a job cheaply. ``build_model`` takes the keras
module as an argument and is only called inside a training process.

Keras applications are built with ``weights=None`` (random initialisation), so nothing
is ever fetched from the network. ``resnet18`` is built here (Keras ships no ResNet-18):
the basic-block ResNet of He et al. 2016, stages of 2 blocks with 64/128/256/512 filters.
"""

from __future__ import annotations

import math

from typing import Any, Mapping

MODELS = ("mlp", "cnn", "resnet18", "mobilenetv2", "resnet50", "efficientnetb0", "vgg16")

# Per-example input shape used with synthetic data when --input-shape is not given.
# 32x32x3 (CIFAR-sized) keeps the ImageNet architectures affordable on a CPU testbed;
# every keras.applications model used here accepts 32x32 inputs.
DEFAULT_INPUT_SHAPES: Mapping[str, tuple[int, ...]] = {
    "mlp": (784,), "cnn": (32, 32, 3), "resnet18": (32, 32, 3), "mobilenetv2": (32, 32, 3),
    "resnet50": (32, 32, 3), "efficientnetb0": (32, 32, 3), "vgg16": (32, 32, 3),
}
DEFAULT_CLASSES = 10

# Smallest spatial size each convolutional model accepts (height and width).
_MIN_SIDE = {"cnn": 4, "resnet18": 8, "mobilenetv2": 32, "resnet50": 32, "efficientnetb0": 32, "vgg16": 32}

_APPLICATIONS = {"mobilenetv2": "MobileNetV2", "resnet50": "ResNet50",
                 "efficientnetb0": "EfficientNetB0", "vgg16": "VGG16"}


MAX_INPUT_ELEMENTS = 2**20


def parse_input_shape(text: str) -> tuple[int, ...]:
    """"32x32x3" or "784" -> (32, 32, 3) or (784,); every dimension a positive integer."""
    parts = text.strip().lower().replace(",", "x").split("x")
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError(f"{text!r} is not a shape such as 32x32x3 or 784") from None
    if not shape or any(dim < 1 for dim in shape):
        raise ValueError(f"{text!r}: every dimension must be a positive integer")
    if len(shape) > 3 or math.prod(shape) > MAX_INPUT_ELEMENTS:
        # a worker would allocate batch x this before its first step (and the mlp 512 x it)
        raise ValueError(f"{text!r}: at most 3 dimensions and {MAX_INPUT_ELEMENTS} values per example "
                         "(ImageNet's 224x224x3 is 150528)")
    return shape


def format_input_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(dim) for dim in shape)


def check_input(model: str, shape: tuple[int, ...], classes: int) -> None:
    """Raise ValueError (saying what to change) if `model` cannot take `shape` and `classes`."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    if classes < 2:
        raise ValueError(f"classes must be at least 2, got {classes}")
    if model == "mlp":
        return  # flattens whatever it gets
    if len(shape) != 3:
        raise ValueError(f"model {model} needs an image shape HxWxC such as 32x32x3, got "
                         f"{format_input_shape(shape)}")
    side = _MIN_SIDE[model]
    if shape[0] < side or shape[1] < side:
        raise ValueError(f"model {model} needs images of at least {side}x{side}, got "
                         f"{format_input_shape(shape)}")


def build_model(keras: Any, name: str, input_shape: tuple[int, ...], classes: int) -> Any:
    """Build the named model, outputting logits for `classes` classes (seed first for same weights)."""
    check_input(name, input_shape, classes)
    layers = keras.layers
    if name == "mlp":
        # for 784 inputs: 784*512+512 + 512*512+512 + 512*10+10 = 669,706 parameters
        return keras.Sequential([
            keras.Input(shape=input_shape),
            layers.Flatten(),
            layers.Dense(512, activation="relu"),
            layers.Dense(512, activation="relu"),
            layers.Dense(classes),
        ], name="mlp")
    if name == "cnn":
        return keras.Sequential([
            keras.Input(shape=input_shape),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(classes),
        ], name="cnn")
    if name == "resnet18":
        return _resnet18(keras, input_shape, classes)
    app = getattr(keras.applications, _APPLICATIONS[name])
    # logits out (no softmax): the loss takes logits
    return app(weights=None, input_shape=input_shape, classes=classes, classifier_activation=None)


def _resnet18(keras: Any, input_shape: tuple[int, ...], classes: int) -> Any:
    layers = keras.layers

    def block(x: Any, filters: int, stride: int) -> Any:
        shortcut = x
        y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.BatchNormalization()(y)
        y = layers.ReLU()(y)
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = layers.BatchNormalization()(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
            shortcut = layers.BatchNormalization()(shortcut)
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input(shape=input_shape)
    # a 3x3 stem without max-pooling: the CIFAR variant, as 32x32 inputs are the default
    x = layers.Conv2D(64, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for stage, filters in enumerate((64, 128, 256, 512)):
        x = block(x, filters, 1 if stage == 0 else 2)
        x = block(x, filters, 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes)(x), name="resnet18")


def model_size(model: Any) -> tuple[int, int]:
    """(parameter count, bytes of all weights) of a built model, trainable or not."""
    params = 0
    size = 0
    for variable in model.weights:
        count = 1
        for dim in variable.shape:
            count *= int(dim)
        params += count
        size += count * _dtype_bytes(str(variable.dtype))
    return params, size


def _dtype_bytes(dtype: str) -> int:
    for bits in (64, 32, 16, 8):
        if dtype.endswith(str(bits)):
            return bits // 8
    return 4
