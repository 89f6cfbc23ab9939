"""Elastic membership: a job that changes its ranks while training goes on (``ddlrun --min-np``).

* :mod:`~ddl_tf.membership.settings`: the job's elastic settings, from the
  environment ``ddlrun`` sets;
* :mod:`~ddl_tf.membership.discovery`: running the host discovery script and the
  blacklist of failed hosts (also used by ``ddlrun``, without MPI);
* :mod:`~ddl_tf.membership.reform`: re-forming the job over MPI's fault
  tolerance (ULFM): shrink past failed ranks, spawn ranks on new hosts.

The state objects and ``hvd.elastic.run`` live in the framework layers
(:mod:`ddl_tf.tensorflow.elastic`, :mod:`ddl_tf.keras.elastic`).
"""
