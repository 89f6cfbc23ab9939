"""A small zoo of compiled Keras models: what the tests, benchmarks, examples and demo train.

Every builder returns a compiled ``keras.Model`` (fixed seed, XLA off) whose
training step :func:`tflms.analyze` and :func:`tflms.train_step_graph` trace;
:func:`synthetic_data` makes matching batches. Sizes are parameters, so the
same model serves a 2-second CPU test and a simulated 16 GiB V100:

============  =============================================================
``cnn``       3x3 convolutions (+ BatchNorm) + ReLU, pooled classifier
``resnet``    a small residual network (basic blocks with BatchNorm)
``resnet50``  ``keras.applications.ResNet50``
``vgg16``     ``keras.applications.VGG16``
``unet3d``    the demo's 3D U-Net with its class-weighted CE + Dice loss
``isensee2017`` the seed paper's 3D U-Net (BraTS 2017) with its Dice loss
``mlp``       dense ReLU layers
``transformer`` a BERT-like encoder with a pooled classifier
``bert``      BERT-base (published configuration), masked-LM loss
``gpt2``      GPT-2 small (published configuration), causal LM loss
``lstm``      dense + LSTM (a ``While`` loop)
``lstm_lm``   the medium LSTM language model of Zaremba et al. (2014)
============  =============================================================

Example:
    >>> import tflms
    >>> from tflms import zoo
    >>> model = zoo.build("cnn", image=8, filters=(4,))
    >>> x, y = zoo.synthetic_data(model, 4)
    >>> tflms.analyze(model, batch_size=len(x)).graph["batch_size"]
    4
"""

from tflms.errors import ConfigError
from tflms.utils.exports import lazy_exports

__getattr__, __dir__, _exported = lazy_exports(
    __name__,
    {
        "cnn": "tflms.zoo.vision",
        "resnet": "tflms.zoo.vision",
        "resnet50": "tflms.zoo.vision",
        "vgg16": "tflms.zoo.vision",
        "unet3d": "tflms.zoo.unet",
        "SegmentationLoss": "tflms.zoo.unet",
        "isensee2017": "tflms.zoo.isensee",
        "InstanceNormalization": "tflms.zoo.isensee",
        "WeightedDiceLoss": "tflms.zoo.isensee",
        "mlp": "tflms.zoo.sequence",
        "transformer": "tflms.zoo.sequence",
        "lstm": "tflms.zoo.sequence",
        "bert": "tflms.zoo.language",
        "gpt2": "tflms.zoo.language",
        "GPT2_SIZES": "tflms.zoo.language",
        "lstm_lm": "tflms.zoo.language",
        "synthetic_data": "tflms.zoo.data",
    },
)

MODELS = (
    "cnn",
    "resnet",
    "resnet50",
    "vgg16",
    "unet3d",
    "isensee2017",
    "mlp",
    "transformer",
    "bert",
    "gpt2",
    "lstm",
    "lstm_lm",
)
"""Names :func:`build` accepts."""

__all__ = ["MODELS", "build", *_exported]


def build(name: str, **options):
    """Build the zoo model ``name`` with keyword ``options`` (see each builder).

    Args:
        name: A key of :data:`MODELS` (``"resnet50"``, ``"unet3d"``...).
        **options: Keyword arguments of that model's builder (batch size,
            image size, optimizer...).

    Returns:
        The compiled ``keras.Model``.

    Raises:
        ConfigError: ``name`` is not in :data:`MODELS`.
    """
    if name not in MODELS:
        raise ConfigError(f"Unknown zoo model {name!r}. Known: {', '.join(MODELS)}.")
    return __getattr__(name)(**options)
