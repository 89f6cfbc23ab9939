"""Sharded optimizer state (ZeRO-1) and sharded gradients (ZeRO-2) for Keras 3 optimizers.

Replicated data parallelism keeps every optimizer slot on every rank: with
AdamW in float32 a parameter costs 16 bytes on each of them (weight,
gradient, two slots). :class:`ShardedOptimizer` gives each trainable
variable one *owner* rank; only the owner builds that variable's slots and
runs its update, then the updated weights are allgathered so that every
rank holds the whole model again (Rajbhandari et al., "ZeRO", 2020):

- ``sharding="optimizer"`` (ZeRO-1): the gradients are allreduced exactly as
  without sharding (same buckets, same overlap, same algorithm), each rank
  updates the variables it owns, and the updated weights are allgathered.
  Each rank keeps about ``1/N`` of the optimizer state.
- ``sharding="gradients"`` (ZeRO-2): the gradients are reduce-scattered
  instead: rank ``r`` receives the reduced gradients of its own variables
  only, so the reduced gradients of other ranks' variables never exist on
  it. Inside a graph the reduce-scatters run in buckets, in the order
  backprop produces the gradients, overlapping the backward pass as the
  allreduce's buckets do (each bucket balanced between its owners:
  :func:`balanced_buckets`); eagerly, one fused reduce-scatter. A bucket's
  rows are assembled on the host when its reduce-scatter runs
  (:func:`~ddl_tf.tensorflow.reducescatter_ops.scatter_rows`), so a bucket
  queued behind others holds its gradients and no copy of them. The bytes on
  the wire are those of one allreduce (a reduce-scatter and an allgather).

Ownership is by whole variable (largest first onto the least-loaded rank,
the same on every rank), so any Keras optimizer shards, element-wise or
not (Adafactor's factored moments, LAMB's trust ratio and Muon's matrix
updates are per variable): each owner runs the optimizer's own update on
the whole variable. The update of a variable is therefore the replicated
update, bit for bit, whenever its reduced gradient is: always with
``"optimizer"``; with ``"gradients"`` when the reduce-scatter sums in the
allreduce's order (two ranks always; on more, MPI's reduce-scatter may
add the ranks in another order, a difference of rounding only).
``global_clipnorm`` is computed from every variable's reduced gradient (the
owners exchange their squared norms under ``"gradients"``), as Keras
computes it, so clipping stays the replicated clipping. A rank that owns no
variable still advances ``iterations``.

Checkpoints are written in the replicated layout: saving gathers the shards
(a collective: every rank calls ``model.save``/``save_weights``, see
:func:`ddl_tf.keras.save_model`), and loading takes each rank's slots by
name, so a file written by N ranks loads on M ranks, sharded or not, and in
one process.

In elastic jobs (``ddlrun --min-np``) ``hvd.elastic.KerasState`` keeps the
whole optimizer state, gathered, in host memory at each commit, and after
every membership change :meth:`ShardedOptimizer.reshard` plans the owners
for the new ranks and fills each rank's new share from that commit, a dead
rank's share included (:class:`ddl_tf.keras.elastic.KerasState` says why
this design; docs/sharding.md weighs it against keeping a neighbour's share).
Without that state an elastic job refuses to train a sharded optimizer, and
sharding over a process set is refused there.

Example (one process: one rank owns every variable):
    >>> import keras
    >>> import ddl_tf.keras as hvd
    >>> _ = hvd.init()
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.1), sharding="optimizer")
    >>> w = keras.Variable([1.0, 2.0])
    >>> opt.apply([keras.ops.convert_to_tensor([1.0, 1.0])], [w])
    >>> [round(float(x), 3) for x in w.numpy()]
    [0.9, 1.9]
    >>> hvd.shutdown()
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from ddl_tf.core import basics
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.process_sets import ProcessSet, global_process_set, member_engine
from ddl_tf.errors import CollectiveMismatchError, ConfigError, StallError
from ddl_tf.keras.gradient_reducer import GradientReducer, variable_key, variables_of_apply
from ddl_tf.keras.shard_plan import ShardPlan, check_same_variables, gather_buckets, scatter_groups
from ddl_tf.tensorflow.allgather_ops import gather_parts, gather_tensors
from ddl_tf.tensorflow.allreduce_ops import reduce_tensors
from ddl_tf.tensorflow.overlap import resolve
from ddl_tf.tensorflow.reducescatter_ops import scatter_rows

__all__ = ["SHARDINGS", "ShardedOptimizer", "check_sharding", "from_wrapper_config"]

logger = logging.getLogger(__name__)

SAVE_ON_EVERY_RANK = (
    "Saving a model whose DistributedOptimizer has sharding=... gathers the optimizer "
    "state from every rank, but another rank did not save with this one: a save on rank 0 "
    "alone (`if hvd.rank() == 0: model.save(path)`, or ModelCheckpoint in rank 0's "
    "callbacks only) waits for shards the others never send. Call hvd.save_model(model, "
    "path) on every rank (rank 0 writes the file); in place of ModelCheckpoint, give every "
    "rank a callback that calls it, e.g. keras.callbacks.LambdaCallback(on_epoch_end=lambda "
    "epoch, logs: hvd.save_model(model, path))."
)
"""The fix named when a sharded save meets ranks that did not save."""

SHARDINGS = ("optimizer", "gradients")
"""The values of ``DistributedOptimizer(sharding=...)`` besides None (replicated)."""


def check_sharding(sharding: Any) -> str | None:
    """``sharding`` checked: None, ``"optimizer"`` (ZeRO-1) or ``"gradients"`` (ZeRO-2).

    Raises:
        ConfigError: Any other value.
    """
    if sharding is None or sharding in SHARDINGS:
        return sharding
    raise ConfigError(
        f"sharding must be None (replicated), 'optimizer' (each rank keeps the optimizer "
        f"state of its variables: ZeRO-1) or 'gradients' (also reduce-scatters the gradients: "
        f"ZeRO-2). Received sharding={sharding!r}."
    )


@keras.saving.register_keras_serializable(package="ddl_tf", name="ShardedOptimizer")
class ShardedOptimizer(keras.optimizers.Optimizer):
    """Run ``optimizer``'s update only on this rank's variables, then share the updated weights.

    Made by ``DistributedOptimizer(..., sharding=...)``; it receives gradients
    already reduced (all of them with ``"optimizer"``, this rank's with
    ``"gradients"``: :meth:`reduce` does either).

    Args:
        optimizer: The Keras optimizer doing the updates (built here on this
            rank's variables only).
        sharding: ``"optimizer"`` or ``"gradients"``.
        process_set: The ranks that share the variables (None: all). A rank
            outside the set owns every variable, as it trains alone.
        name: Optimizer name; defaults to ``"Sharded" + inner class name``.

    Raises:
        ConfigError: A bad ``sharding``; an optimizer with ``use_ema`` (its
            averaged weights would live on the owners only); ``global_clipnorm``
            together with ``gradient_accumulation_steps`` or
            ``loss_scale_factor`` (Keras clips after those; clip in the loss instead).
    """

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer,
        sharding: str = "optimizer",
        process_set: ProcessSet | None = None,
        name: str | None = None,
    ) -> None:
        if check_sharding(sharding) is None:
            raise ConfigError("ShardedOptimizer needs sharding='optimizer' or 'gradients'.")
        _refuse_unshardable(optimizer)
        super().__init__(learning_rate=0.0, name=name or f"Sharded{type(optimizer).__name__}")
        # not an attribute Keras's saving walks: the wrapper saves the state, gathered
        self._shard = _Held(optimizer)
        self.sharding = sharding
        self.process_set = process_set
        # Keras would clip each rank's own variables by their own norm: clip here, globally
        innermost = _innermost(optimizer)
        self.global_clipnorm_of_all = innermost.global_clipnorm
        innermost.global_clipnorm = None
        self.plan: ShardPlan | None = None
        self._all: list = []
        self._index: dict = {}
        self._layout: list[str] | None = None
        self._with_gradient: set[int] = set()  # positions, from the last reduce-scatter
        self._saved: list[np.ndarray] | None = None  # gathered by the wrapper's save, for ours
        # set by hvd.elastic.KerasState, which re-forms the shards when an elastic job's
        # ranks change (ddl_tf.keras.elastic); an elastic job trains only then
        self.elastic_tracked = False

    # ------------------------------------------------------------------ state

    def shard_optimizer(self) -> keras.optimizers.Optimizer:
        """The wrapped optimizer, built on this rank's variables only."""
        return self._shard.optimizer

    def save_own_variables(self, store) -> None:
        """The state the wrapper just gathered, again (no collective), as an unsharded inner optimizer saves it.

        Keras saves a wrapper's inner optimizer at its own path; a file written
        here must load into an unsharded ``DistributedOptimizer`` too, whose
        inner optimizer reads that path.

        Args:
            store: Keras's variable store.
        """
        for k, value in enumerate(self._saved or []):
            store[str(k)] = value
        self._saved = None

    def load_own_variables(self, store) -> None:
        """Nothing: the wrapping ``DistributedOptimizer`` loads this rank's state.

        Args:
            store: Keras's variable store.
        """

    def build(self, var_list) -> None:
        """Assign the variables to ranks and build the inner optimizer on this rank's.

        Args:
            var_list: Every trainable variable the optimizer will update (the
                same list, in the same order, on every rank).

        Raises:
            ConfigError: A ``process_set`` in an elastic job (see
                :func:`_refuse_elastic_process_set`); or the sharing ranks were
                given different variables (count, shapes or dtypes), on every
                one of them.
        """
        _refuse_elastic_process_set(self.process_set)
        engine = member_engine(self.process_set)
        size, rank = (1, 0) if engine is None else (engine.size, engine.rank)
        if size > 1:
            check_same_variables(engine, list(var_list), f"{self.name}_variables")
        self._all = list(var_list)
        self._index = {variable_key(v): i for i, v in enumerate(self._all)}
        self.plan = ShardPlan.balance(self._all, size, rank)
        owned = [self._all[i] for i in self.plan.mine()]
        if not self._shard.optimizer.built:
            with keras.name_scope(self._shard.optimizer.name, caller=self._shard.optimizer):
                self._shard.optimizer.build(owned)
            self._shard.optimizer.built = True
        super().build(var_list)

    @property
    def variables(self) -> list:
        return self._shard.optimizer.variables

    @property
    def iterations(self):
        return self._shard.optimizer.iterations

    @property
    def learning_rate(self):
        return self._shard.optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        """Set the inner optimizer's learning rate.

        Args:
            value: A float, a schedule or a variable, as Keras accepts.
        """
        self._shard.optimizer.learning_rate = value

    def scale_loss(self, loss):
        """The loss as the inner optimizer scales it.

        Args:
            loss: The loss tensor.

        Returns:
            The scaled loss.
        """
        return self._shard.optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list) -> None:
        """Nothing to finalize (``use_ema`` is refused under sharding).

        Args:
            var_list: The model's trainable variables.
        """

    # ------------------------------------------------------------------ updates

    def reduce(self, reducer: GradientReducer, grads: list, variables: list, overlap=None) -> list:
        """The gradients this rank needs, reduced: all (``"optimizer"``) or its own (``"gradients"``).

        Args:
            reducer: The wrapping optimizer's reducer (op, compression, process set).
            grads: One gradient per variable (None where a variable has none).
            variables: The variables, in the same order.
            overlap: As for :meth:`GradientReducer.reduce` (``"optimizer"`` only).

        Returns:
            One gradient per variable; under ``"gradients"`` None for other ranks' variables.

        Raises:
            ConfigError: Variables registered as local (``PartialDistributedOptimizer``).
        """
        if reducer.has_local_variables():
            raise ConfigError(
                "DistributedOptimizer(sharding=...) cannot keep local variables "
                "(register_local_var / PartialDistributedOptimizer): their gradients differ "
                "between ranks, but sharding updates each variable on one rank. Use "
                "sharding=None with local variables."
            )
        if self.sharding == "optimizer":
            return reducer.reduce(grads, variables, overlap)
        engine = member_engine(reducer.process_set)
        if engine is None:
            return list(grads)
        plan = self._plan_for(variables)
        positions = self._positions(variables)
        by_position = dict(zip(positions, grads, strict=True))
        # which variables have a gradient at all (the same on every rank): global_clipnorm
        self._with_gradient = {p for p, g in by_position.items() if g is not None}
        out: list = [None] * len(variables)
        slot_of = {p: k for k, p in enumerate(positions)}
        bucketing = reducer.bucketing
        if overlap is not None and overlap != bucketing.overlap:
            bucketing = resolve(overlap, bucketing.bucket_bytes)
        name = f"{reducer.name}_reducescatter"
        for label, members in scatter_groups(plan, by_position, bucketing, name):
            matrices, widths, segments = [], [], []
            for dtype in sorted({plan.dtypes[i] for i in members}):
                rows = [
                    [i for i in members if plan.owners[i] == r and plan.dtypes[i] == dtype]
                    for r in range(plan.size)
                ]
                width = max(sum(plan.sizes[i] for i in row) for row in rows)
                if width == 0:
                    continue
                matrices.append(
                    [[_flat(by_position.get(i), self._all[i]) for i in row] for row in rows]
                )
                widths.append(width)
                segments.append(rows[plan.rank])
            if not matrices:
                continue
            # the rows are assembled when the collective runs: a queued bucket holds no stacked copy
            received = scatter_rows(engine, matrices, widths, reducer.spec, label)
            for segment, mine in zip(segments, received, strict=True):
                start = 0
                for i in segment:
                    n = plan.sizes[i]
                    if i in slot_of:
                        out[slot_of[i]] = tf.reshape(mine[0, start : start + n], self._all[i].shape)
                    start += n
        return out

    def apply(self, grads, trainable_variables=None) -> None:
        """Update this rank's variables with their reduced gradients, then gather every weight.

        Args:
            grads: One reduced gradient per variable (others' may be None under
                ``"gradients"``).
            trainable_variables: The variables, in the same order; None: those
                it was built with.
        """
        variables = variables_of_apply(self, trainable_variables, self._trainable_variables)
        self._refuse_untracked_elastic()
        plan = self._plan_for(variables)
        grads = list(grads)
        if self.global_clipnorm_of_all:
            grads = self._clip_globally(grads, variables, plan)
        positions = self._positions(variables)
        owned = [
            (g, v)
            for g, v, p in zip(grads, variables, positions, strict=True)
            if plan.owners[p] == plan.rank and g is not None
        ]
        if owned:
            self._shard.optimizer.apply([g for g, _ in owned], [v for _, v in owned])
        else:  # Keras returns early on an empty list: keep the step count of the others
            self._shard.optimizer.iterations.assign_add(1)
        self._share_weights(plan)

    def _clip_globally(self, grads: list, variables: list, plan: ShardPlan) -> list:
        """Keras's ``clip_by_global_norm`` over every variable's reduced gradient.

        Under ``"gradients"`` each rank has its own variables' gradients only:
        the owners' squared norms are gathered, and summed in variable order
        as Keras sums them.
        """
        clip = self.global_clipnorm_of_all
        squares = [None if g is None else ops.sum(ops.square(g)) for g in grads]
        if self.sharding == "gradients" and plan.size > 1:
            squares = self._gather_squares(squares, variables, plan)
        present = [s for s in squares if s is not None]
        if not present:
            return grads
        norm = ops.sqrt(ops.sum(ops.stack(present)))
        scale = clip * ops.minimum(1.0 / norm, 1.0 / clip)
        scale = scale + (norm - norm)  # NaN for an infinite norm, as Keras
        return [g if g is None else g * scale for g in grads]

    def _gather_squares(self, squares: list, variables: list, plan: ShardPlan) -> list:
        """Every variable's squared gradient norm, from its owner (None where it has no gradient)."""
        engine = member_engine(self.process_set)
        positions = self._positions(variables)
        here = dict(zip(positions, squares, strict=True))
        present = self._with_gradient
        mine = [i for i in plan.mine() if i in present]
        values = tf.stack([tf.cast(here[i], tf.float32) for i in mine] + [tf.zeros([])])[:-1]
        gathered = gather_tensors(engine, [values], f"{self.name}_clip_norms")[0]
        order = [i for r in range(plan.size) for i in plan.of_rank(r) if i in present]
        at = {i: k for k, i in enumerate(order)}
        return [gathered[at[p]] if p in at else None for p in positions]

    def _share_weights(self, plan: ShardPlan) -> None:
        """Allgather each rank's updated variables in fused messages, and assign the others' on this rank."""
        engine = member_engine(self.process_set)
        if engine is None or plan.size == 1:
            return
        fusion = engine.config.fusion_threshold_bytes  # DDL_FUSION_THRESHOLD
        for k, bucket in enumerate(gather_buckets(plan, fusion)):
            members = set(bucket)
            dtypes = sorted({plan.dtypes[i] for i in bucket})
            # this rank's updated variables, joined on the host by the collective itself
            mine = [
                [self._all[i].value for i in plan.of(plan.rank, dtype) if i in members]
                for dtype in dtypes
            ]
            gathered = gather_parts(
                engine, mine, [tf.as_dtype(d) for d in dtypes], f"{self.name}_weights_b{k}"
            )
            for dtype, flat in zip(dtypes, gathered, strict=True):
                total = sum(plan.sizes[i] for i in bucket if plan.dtypes[i] == dtype)
                flat = tf.reshape(flat, [total])  # a static shape, for Grappler and tflms
                start = 0
                for r in range(plan.size):
                    for i in plan.of(r, dtype):
                        if i not in members:
                            continue
                        n = plan.sizes[i]
                        if r != plan.rank:
                            variable = self._all[i]
                            variable.assign(tf.reshape(flat[start : start + n], variable.shape))
                        start += n

    def _refuse_untracked_elastic(self) -> None:
        """Refuse to train in an elastic job unless a ``KerasState`` re-forms the shards.

        Raises:
            ConfigError: An elastic job, and no ``hvd.elastic.KerasState`` tracks
                this optimizer.
        """
        if self.elastic_tracked or not basics.is_initialized() or not basics.job().elastic:
            return
        raise ConfigError(
            "DistributedOptimizer(sharding=...) trains in an elastic job only with its state "
            "in ddl_tf.keras.elastic.KerasState (hvd.elastic.KerasState(model) with "
            "import ddl_tf.keras as hvd): when ranks leave or join, it re-forms the shards "
            "from the last commit. TensorFlowKerasState, TensorFlowState and a job without "
            "an elastic state do not, and the shards of a lost rank would be gone. Track the "
            "model with hvd.elastic.KerasState(model, ...), or use sharding=None."
        )

    def _plan_for(self, variables: list) -> ShardPlan:
        if self.plan is None:
            self.build(variables)
        assert self.plan is not None  # made by build
        return self.plan

    def _positions(self, variables: list) -> list[int]:
        try:
            return [self._index[variable_key(v)] for v in variables]
        except KeyError:
            raise ConfigError(
                "DistributedOptimizer(sharding=...) was built on other variables than it is "
                "given now; a sharded optimizer updates the variables it was first built "
                "with (the same list on every rank). Build a new optimizer for new variables."
            ) from None

    # ------------------------------------------------------------------ checkpoints

    def replicated_layout(self) -> list[str]:
        """The inner optimizer's variables (paths less the optimizer's scope) as one unsharded optimizer orders them.

        Made once, from a copy of the optimizer built on every variable on the
        host CPU (its memory is freed at once: only the names are kept).
        """
        if self._layout is None:
            inner = self._shard.optimizer
            twin = type(inner).from_config(inner.get_config())
            with tf.device("/CPU:0"):
                with keras.name_scope(twin.name, caller=twin):
                    twin.build(self._all)
            self._layout = [_slot_key(v) for v in twin.variables]
            del twin
        return self._layout

    def gather_shards(self, name: str | None = None) -> dict[str, np.ndarray]:
        """Every rank's optimizer variables by path (a collective over the sharing ranks).

        For a save (no ``name``), the collective's name says what it is and
        what every rank must call, so that a rank that meets it in a mismatch
        or stall message (rank 0 saving alone, the others training on or
        shutting down) learns the fix.

        Args:
            name: The collective's name for another purpose (an elastic
                commit); errors are then passed on as they are.

        Returns:
            ``{path less the optimizers' scopes: value}`` for every optimizer
            variable of every rank (rank 0's copy of those every rank holds,
            such as ``iterations``).

        Raises:
            ConfigError: The optimizer was never built.
            CollectiveMismatchError: Another rank issued another collective
                (it did not save): the message leads with the fix.
            StallError: Another rank did not come within
                ``DDL_STALL_SHUTDOWN_SECONDS``: the message leads with the fix.
        """
        if self.plan is None:
            raise ConfigError(
                "a sharded optimizer saves its state after it was built (after the first "
                "training step or optimizer.build(model.trainable_variables))."
            )
        mine = self.own_state()
        engine = member_engine(self.process_set)
        if engine is None:
            return mine
        if name is not None:
            shards = engine.allgather_object(mine, name=name)
        else:
            name = (
                f"{self.name}_checkpoint (a sharded save: hvd.save_model(model, path) on every "
                "rank)"
            )
            try:
                shards = engine.allgather_object(mine, name=name)
            except (CollectiveMismatchError, StallError) as err:
                raise type(err)(SAVE_ON_EVERY_RANK + f" What the ranks did: {err}") from err
        merged: dict[str, np.ndarray] = {}
        for shard in reversed(shards):
            merged.update(shard)  # rank 0's copy of the shared ones (iterations, ...) wins
        return merged

    def gathered_values(self, keep: bool = False) -> list[np.ndarray]:
        """:meth:`gather_shards` in :meth:`replicated_layout` order (a collective).

        Args:
            keep: Keep them for this optimizer's own save, which Keras makes
                right after its wrapper's.
        """
        merged = self.gather_shards()
        values = [merged[path] for path in self.replicated_layout()]
        if keep:
            self._saved = values
        return values

    def assign_from(self, values: list[np.ndarray]) -> None:
        """Take this rank's variables out of values saved in :meth:`replicated_layout` order.

        Raises:
            ConfigError: ``values`` has another length than the layout (another
                optimizer or model).
        """
        layout = self.replicated_layout()
        if len(values) != len(layout):
            raise ConfigError(
                f"the checkpoint holds {len(values)} variables of optimizer "
                f"{self._shard.optimizer.name!r}, but this optimizer on this model has "
                f"{len(layout)}: it was saved with another optimizer or model. Load it into "
                "the model it was saved from, or compile with that optimizer."
            )
        where = {path: k for k, path in enumerate(layout)}
        for variable in self._shard.optimizer.variables:
            variable.assign(values[where[_slot_key(variable)]])

    # ------------------------------------------------------------------ elastic re-formation

    def own_state(self) -> dict[str, np.ndarray]:
        """This rank's optimizer variables by path (less the optimizers' scopes), copied to the host.

        Local: no collective. Its slots, and what every rank holds (``iterations``,
        ``learning_rate``).
        """
        return {_slot_key(v): v.numpy() for v in self._shard.optimizer.variables}

    def assign_state(self, state: dict[str, np.ndarray]) -> None:
        """Take this rank's optimizer variables out of a whole state by path (local).

        Args:
            state: Every variable's value by path, as :meth:`gather_shards`
                returns it (more may be given: only this rank's are read).

        Raises:
            ConfigError: ``state`` lacks one of this rank's variables (another
                optimizer or model, or a state that is not whole).
        """
        variables = self._shard.optimizer.variables
        missing = [_slot_key(v) for v in variables if _slot_key(v) not in state]
        if missing:
            raise ConfigError(
                f"the optimizer state given to {self.name} lacks {len(missing)} of this rank's "
                f"variables (first: {missing[0]!r}): it was taken from another optimizer or "
                "model, or from one rank's share only. Give the whole state, as "
                "gather_shards() returns it, of the same model and optimizer."
            )
        for variable in variables:
            variable.assign(state[_slot_key(variable)])

    def fits_current_ranks(self) -> bool:
        """Whether the shards were planned for the ranks the job has now (same size, same rank).

        False before the build, and after an elastic job re-formed until
        :meth:`reshard`.
        """
        if self.plan is None:
            return False
        engine = member_engine(self.process_set)
        size, rank = (1, 0) if engine is None else (engine.size, engine.rank)
        return (self.plan.size, self.plan.rank) == (size, rank)

    def current_over(self, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``state`` with this rank's variables replaced by their current values (local).

        Args:
            state: A whole state by path (:meth:`gather_shards`).

        Returns:
            A new dictionary; ``state`` is left as it is.
        """
        return {**state, **self.own_state()}

    def reshard(self, state: dict[str, np.ndarray], check: bool = True) -> None:
        """Re-form the shards for the ranks the job has now, from a whole state.

        Plans the owners again for the current ranks (:meth:`ShardPlan.balance`),
        replaces the inner optimizer by a new one of the same configuration
        built on this rank's new share (the old one's slots are freed), and
        assigns its variables from ``state``: every variable's slots, whichever
        rank owned it before (one that left, or none yet), and ``iterations``.
        Called by :class:`ddl_tf.keras.elastic.KerasState` after an elastic job
        re-formed, with the last commit; Keras must trace the step again (the
        state does so).

        Args:
            state: The whole optimizer state by path (:meth:`gather_shards`), e.g.
                an elastic commit.
            check: Compare the ranks' variable lists first (a collective, as the
                build's: a rank that joins makes it in its own build). False:
                no collective.

        Raises:
            ConfigError: The optimizer was never built; ranks with different
                variables (with ``check``); ``state`` lacks a variable of this
                rank's new share.
        """
        if self.plan is None:
            raise ConfigError(
                f"{self.name} cannot re-form shards it never had: build it first "
                "(optimizer.build(model.trainable_variables), or a training step)."
            )
        engine = member_engine(self.process_set)
        size, rank = (1, 0) if engine is None else (engine.size, engine.rank)
        if check and size > 1:
            check_same_variables(engine, self._all, f"{self.name}_variables")
        plan = ShardPlan.balance(self._all, size, rank)
        old = self._shard.optimizer
        fresh = type(old).from_config(old.get_config())
        with keras.name_scope(fresh.name, caller=fresh):
            fresh.build([self._all[i] for i in plan.mine()])
        fresh.built = True
        self._shard = _Held(fresh)
        self.plan = plan
        self.assign_state(state)
        logger.debug(
            "%s re-formed its shards for %d rank(s): rank %d owns %d of %d variables",
            self.name,
            size,
            rank,
            len(plan.mine()),
            len(self._all),
        )

    def get_config(self) -> dict:
        inner = self._shard.optimizer
        config = keras.saving.serialize_keras_object(inner)
        if self.global_clipnorm_of_all:  # back where the user set it, the innermost optimizer
            config = _with_clipnorm(config, self.global_clipnorm_of_all)
        return {"name": self.name, "optimizer": config, "sharding": self.sharding}

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> ShardedOptimizer:
        """Rebuild from :meth:`get_config` (a saved model is loaded).

        Args:
            config: The dictionary :meth:`get_config` returned.
            custom_objects: Passed on to deserialize the inner optimizer.

        Returns:
            A new :class:`ShardedOptimizer`.
        """
        return from_wrapper_config(cls, config, custom_objects)


def from_wrapper_config(cls: type, config: dict, custom_objects=None) -> Any:
    """``cls(inner, **rest)`` from a wrapping optimizer's config, whose ``"optimizer"`` is the inner one's.

    Args:
        cls: The wrapping optimizer's class.
        config: Its ``get_config()``.
        custom_objects: Passed on to deserialize the inner optimizer.
    """
    config = dict(config)
    inner = keras.saving.deserialize_keras_object(
        config.pop("optimizer"), custom_objects=custom_objects
    )
    return cls(inner, **config)


class _Held:
    """Holds the wrapped optimizer out of the attributes Keras's saving walks.

    Keras saves every optimizer it reaches through an attribute with that
    optimizer's own variables: here a shard, which would load into another
    rank's shard (or fail) when the rank count changes.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        self.optimizer = optimizer


def save_sharded(store: Any, own: list, sharded: ShardedOptimizer) -> None:
    """Write a wrapper's own variables, then the shards in the replicated layout (collective)."""
    for i, variable in enumerate(own):
        store[str(i)] = variable.numpy()
    for k, value in enumerate(sharded.gathered_values(keep=True)):
        store[str(len(own) + k)] = value


def load_sharded(store: Any, own: list, sharded: ShardedOptimizer) -> None:
    """Read what :func:`save_sharded` (or an unsharded wrapper) wrote: this rank's variables."""
    for i, variable in enumerate(own):
        variable.assign(store[str(i)])
    count = len(store.keys()) - len(own)
    sharded.assign_from([store[str(len(own) + k)] for k in range(count)])


def agree_finite(finite, process_set: ProcessSet | None):
    """``finite`` and-ed over the ranks (each rank checked its own variables' gradients)."""
    engine = member_engine(process_set)
    if engine is None or engine.size == 1:
        return finite
    flag = tf.reshape(tf.cast(finite, tf.float32), [1])
    spec = ReduceSpec.of(ReduceOp.MIN)
    lowest = reduce_tensors(engine, [flag], spec, "ddl_sharded_finite")[0]
    return ops.greater(lowest[0], 0.5)


def _slot_key(variable: Any) -> str:
    """An optimizer variable's path without the scopes of the optimizers (which Keras may nest and number)."""
    return variable.path.rsplit("/", 1)[-1]


def _flat(grad: Any, variable: Any) -> tf.Tensor:
    """A gradient as a flat dense tensor (zeros for a variable without one)."""
    if grad is None:
        return tf.zeros([int(np.prod(variable.shape, dtype=np.int64))], variable.dtype)
    return tf.reshape(tf.convert_to_tensor(grad), [-1])


def _innermost(optimizer: Any) -> Any:
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _with_clipnorm(config: dict, clipnorm: float) -> dict:
    """A serialized optimizer with ``global_clipnorm`` set on its innermost optimizer."""
    inner = config["config"].get("optimizer")
    if isinstance(inner, dict) and "config" in inner:
        return {
            **config,
            "config": {**config["config"], "optimizer": _with_clipnorm(inner, clipnorm)},
        }
    return {**config, "config": {**config["config"], "global_clipnorm": clipnorm}}


def _refuse_elastic_process_set(process_set: ProcessSet | None) -> None:
    """Refuse sharding over a process set in an elastic job.

    An elastic job drops its process sets when it re-forms (their ranks meant
    other processes), so a set's shards would have no ranks to go to.

    Raises:
        ConfigError: An elastic job and a process set other than the global one.
    """
    if process_set is None or process_set is global_process_set:
        return
    if basics.is_initialized() and basics.job().elastic:
        raise ConfigError(
            "DistributedOptimizer(sharding=..., process_set=...) is not supported in elastic "
            "jobs: a re-formed job drops its process sets, so the set's shards would have no "
            "ranks to move to. Shard over the whole job (process_set=None) in an elastic job, "
            "or use sharding=None with a process set."
        )


def _refuse_unshardable(optimizer: Any) -> None:
    """Refuse the options whose meaning would change when each rank updates a part.

    Raises:
        ConfigError: ``use_ema``; ``global_clipnorm`` with gradient accumulation
            or ``loss_scale_factor``; a wrapped optimizer.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(
            "sharding wraps a Keras optimizer (keras.optimizers.AdamW(...), ...). "
            f"Received {type(optimizer).__name__}."
        )
    wrapper = optimizer
    while hasattr(wrapper, "inner_optimizer"):
        if not getattr(wrapper, "per_variable_update", False):
            raise ConfigError(
                f"sharding cannot wrap {type(wrapper).__name__}: it wraps another optimizer and "
                "does not say that its update of a variable needs that variable's gradient "
                "alone (per_variable_update = True, as tflms.keras.OffloadedOptimizer does). "
                "Pass the plain optimizer, e.g. keras.optimizers.AdamW(...)."
            )
        wrapper = wrapper.inner_optimizer
    optimizer = wrapper
    if getattr(optimizer, "use_ema", False):
        raise ConfigError(
            "DistributedOptimizer(sharding=...) does not support use_ema=True: each rank would "
            "average only the weights it owns. Use sharding=None with use_ema, or keep an "
            "EMA of the weights in a callback."
        )
    clipped = optimizer.global_clipnorm
    if clipped and (optimizer.gradient_accumulation_steps or optimizer.loss_scale_factor):
        raise ConfigError(
            "DistributedOptimizer(sharding=...) clips by the global norm before the update, "
            "but Keras clips after gradient_accumulation_steps / loss_scale_factor: the two "
            "cannot be combined. Drop global_clipnorm, or use sharding=None."
        )
