"""Whether a memory budget leaves room for the optimizer's state on the device, asked in advance.

With ``LMSCallback(memory_budget=..., offload_optimizer=None)`` the callback
decides where the optimizer's state lives before the first step builds it:
Keras's ``compile`` keeps the optimizer object it was given, so a state built
on the device stays there for the whole fit. When the weights, their
gradients and the state exceed the budget alone, no plan could keep the state
on the device and the callback builds it on the host at once. When they fit,
the activations decide, and those are known only from a traced step:
:func:`device_state_refusal` traces the training step, before ``fit`` does,
with an unbuilt copy of the optimizer in the model's place (built inside that
trace, where the user's would be: on the device) and plans the trace under
the budget. Only when no plan fits it, and the state's bytes on the host
would let one fit, does the callback build the user's state on the host.

The copy, its variables and the trace are dropped afterwards; the user's
optimizer is neither built nor changed. The first step is traced and
planned twice then (the trial skips the Grappler check, which changes no
peak).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import tensorflow as tf

from tflms.config import LMSConfig
from tflms.errors import PlanInfeasibleError
from tflms.frontends.lms import LMS
from tflms.keras.step import input_specs, target_specs

__all__ = ["device_state_refusal"]

logger = logging.getLogger(__name__)


def device_state_refusal(
    model: Any,
    config: LMSConfig,
    *,
    batch_size: int,
    batch_source: str | None = None,
    target: Any = None,
) -> PlanInfeasibleError | None:
    """Plan the training step as it would be with the optimizer's state built on the device.

    Runs eagerly, before ``fit`` traces its step: the step traced here takes
    the model's input specs and the targets its loss expects
    (:func:`~tflms.keras.step.input_specs`, :func:`~tflms.keras.step.target_specs`)
    at ``batch_size``; the real trace is planned again on the data ``fit`` feeds.

    Args:
        model: A compiled, built Keras model whose optimizer is not built yet,
            with its own ``train_step``.
        config: The fit's options (``memory_budget`` set); the optimizer's
            state is planned where the step builds it, whatever
            ``offload_optimizer`` says.
        batch_size: The batch each step sees.
        batch_source: Where ``batch_size`` came from.
        target: The fit's :class:`~tflms.Target` (resolved once per fit).

    Returns:
        The auto-tuner's :class:`~tflms.errors.PlanInfeasibleError` when no
        plan fits that step; None when one does, or when the step cannot be
        traced here (a subclassed model has no input specs; an optimizer
        Keras cannot copy): logged, nothing is decided.
    """
    import keras

    try:
        specs = (input_specs(model, batch_size), target_specs(model, batch_size))
        copy = keras.optimizers.deserialize(keras.optimizers.serialize(model.optimizer))
    except Exception as err:  # noqa: BLE001 - any step this cannot trace: not weighed
        logger.info(
            "tflms: could not trace the step of %r with its optimizer's state on the device "
            "(%s: %s); that state is built on the device (offload_optimizer=True builds it "
            "on the host).",
            getattr(model, "name", "model"),
            type(err).__name__,
            err,
        )
        return None
    lms = LMS(config.replace(offload_optimizer=False, check_rewrites=False), target=target)
    refused: list[PlanInfeasibleError] = []

    def step(batch):
        outputs = model.train_step(batch)
        try:
            lms.run(
                tf.compat.v1.get_default_graph(),
                batch_size=batch_size,
                batch_source=batch_source,
                outputs=outputs,
            )
        except PlanInfeasibleError as error:
            refused.append(error)
        return outputs

    own = model.optimizer
    model.optimizer = copy
    try:
        tf.function(step, autograph=False, jit_compile=False).get_concrete_function(specs)
    finally:
        model.optimizer = own
        del copy, step
        gc.collect()  # the copy's variables: freed before the step builds the user's
    return refused[0] if refused else None
