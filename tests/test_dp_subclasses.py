"""Which DataParallel subclasses convert, and where their calls pass the model
(ddpify/project/dp_subclasses.py)."""

from __future__ import annotations

import pytest

from ddpify.project.dp_subclasses import SubclassPlan, plan_from_code

FORWARDING = '''
class DataParallel(torch.nn.DataParallel):
    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super(DataParallel, self).__init__(module, device_ids, output_device, dim)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)
'''
LEADING_ARGUMENT = '''
class BalancedDataParallel(DataParallel):
    def __init__(self, gpu0_bsz, *args, **kwargs):
        self.gpu0_bsz = gpu0_bsz
        super().__init__(*args, **kwargs)

    def scatter(self, inputs, kwargs, device_ids):
        return scatter_kwargs(inputs, kwargs, device_ids, self.chunks(inputs), dim=self.dim)

    def chunks(self, inputs):
        return [self.gpu0_bsz]
'''
EXPLICIT_BASE = '''
class ChunkedDataParallel(nn.DataParallel):
    def __init__(self, chunk_sizes, net, device_ids=None):
        nn.DataParallel.__init__(self, net, device_ids)
        self.chunk_sizes = chunk_sizes
'''
COMPUTING_FORWARD = '''
class LossDataParallel(nn.DataParallel):
    def forward(self, x, y):
        return criterion(super().forward(x), y)
'''


def test_a_forwarding_subclass_takes_the_model_first():
    assert plan_from_code(FORWARDING) == SubclassPlan(True, 0, "module")


def test_a_model_after_the_subclass_s_own_arguments_is_found():
    assert plan_from_code(EXPLICIT_BASE) == SubclassPlan(True, 1, "net")


@pytest.mark.parametrize("code, reason", [
    (LEADING_ARGUMENT, "overrides chunks()"),
    (COMPUTING_FORWARD, "overrides forward()"),
])
def test_a_subclass_that_changes_what_the_model_returns_is_refused(code, reason):
    assert plan_from_code(code) == reason


SYNC_BN_CALLBACKS = '''
class DataParallelWithCallback(DataParallel):
    def replicate(self, module, device_ids):
        modules = super(DataParallelWithCallback, self).replicate(module, device_ids)
        execute_replication_callbacks(modules)
        return modules
'''


def test_a_replicate_that_synchronises_batchnorm_converts_with_torch_sync_batchnorm():
    # Synchronized-BatchNorm-PyTorch: its replicas' BatchNorm callbacks are torch's SyncBatchNorm under DDP
    plan = plan_from_code(SYNC_BN_CALLBACKS)
    assert isinstance(plan, SubclassPlan) and plan.sync_bn


def test_a_replicate_that_does_more_than_its_callbacks_is_refused():
    busy = SYNC_BN_CALLBACKS.replace("        return modules", "        log_replicas(modules)\n        return modules")
    assert "does more than copy the model in replicate()" in plan_from_code(busy)
