"""Patch every node of a Ray cluster (issue 31): ``toolkit apply-patch --ray``, ``toolkit revert --ray``,
``toolkit status --ray``, or from Python::

    from toolkit.ray import apply_patch_on_cluster
    report = apply_patch_on_cluster(patches=["tito", "patch-sweep"])   # raises ClusterPatchError naming failed nodes
    os.environ.update(report.engine_env)                               # each vLLM process then checks its node

This is the public face; the work is done in :mod:`toolkit.cluster.every_node` (a task per node) and
:mod:`toolkit.cluster.connect` (the Ray connection). ``ray`` is imported only on first use: it is no
dependency of this package.
"""

from toolkit.cluster.every_node import (DEFAULT_NODE_TIMEOUT, ClusterPatchError, ClusterReport, NodeResult,
                                 apply_patch_on_cluster, patch_status_on_cluster, revert_patch_on_cluster)

__all__ = ["DEFAULT_NODE_TIMEOUT", "ClusterPatchError", "ClusterReport", "NodeResult", "apply_patch_on_cluster",
           "patch_status_on_cluster", "revert_patch_on_cluster"]
