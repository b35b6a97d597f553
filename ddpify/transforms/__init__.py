"""The conversion pipeline: one module per transform, run in this order.

Order matters where transforms build on each other: the sampler marks the loaders it
shards before batch_size and set_epoch look at them; rank_zero guards statements before
process_group wraps the entry point in try/finally; imports come last, once every
transform has scheduled what it needs.
"""

from ddpify.transforms.agreed_branches import AgreedBranchesTransform
from ddpify.transforms.agreed_failures import AgreedFailuresTransform
from ddpify.transforms.batch_losses import BatchLossesTransform
from ddpify.transforms.batch_reads import BatchReadsTransform
from ddpify.transforms.counted_cuts import CountedCutsTransform
from ddpify.transforms.batch_size import BatchSizeTransform
from ddpify.transforms.decisions import DecisionsTransform
from ddpify.transforms.devices import DevicesTransform
from ddpify.transforms.existing_ddp import ExistingDdpTransform
from ddpify.transforms.handed_losses import HandedLossesTransform
from ddpify.transforms.imports import ImportsTransform
from ddpify.transforms.late_gradients import LateGradientsTransform
from ddpify.transforms.merged_backwards import MergedBackwardsTransform
from ddpify.transforms.no_sync import NoSyncTransform
from ddpify.transforms.own_init import OwnInitTransform
from ddpify.transforms.process_group import ProcessGroupTransform
from ddpify.transforms.rank_zero import RankZeroTransform
from ddpify.transforms.replica_outputs import ReplicaOutputsTransform
from ddpify.transforms.replica_sync import ReplicaSyncTransform
from ddpify.transforms.run_names import RunNamesTransform
from ddpify.transforms.sampler import SamplerTransform
from ddpify.transforms.selected_means import SelectedMeansTransform
from ddpify.transforms.set_epoch import SetEpochTransform
from ddpify.transforms.shared_statistics import SharedStatisticsTransform
from ddpify.transforms.step_results import StepResultsTransform
from ddpify.transforms.summed_losses import SummedLossesTransform
from ddpify.transforms.wrap_model import WrapModelTransform
from ddpify.transforms.wrap_placement import WrapPlacementTransform
from ddpify.transforms.wrap_switches import WrapSwitchesTransform

TRANSFORMS = (
    DevicesTransform,
    WrapModelTransform,
    WrapPlacementTransform,
    BatchLossesTransform,
    HandedLossesTransform,
    SummedLossesTransform,
    ReplicaOutputsTransform,
    ReplicaSyncTransform,
    MergedBackwardsTransform,
    SelectedMeansTransform,
    SamplerTransform,
    CountedCutsTransform,
    BatchSizeTransform,
    BatchReadsTransform,
    SetEpochTransform,
    NoSyncTransform,
    LateGradientsTransform,
    DecisionsTransform,
    RankZeroTransform,
    StepResultsTransform,
    SharedStatisticsTransform,  # (after RankZero's check: never where rank 0 runs alone; RankZero's prints read what it averaged)
    AgreedBranchesTransform,  # (after RankZero: it asks which statements rank 0 runs alone)
    AgreedFailuresTransform,  # (after the others: its points go before the collectives they put in a step)
    RunNamesTransform,
    OwnInitTransform,
    ProcessGroupTransform,
    ImportsTransform,
)
# For a module that names DataParallel but never wraps a model.
REFERENCES_ONLY = (WrapModelTransform, ImportsTransform)
# For a script that already has a DDP path beside DataParallel: select that path.
EXISTING_DDP = (ExistingDdpTransform, SetEpochTransform, ImportsTransform)
# A script that takes that path: its writes outside its own rank guards run on rank 0 (its own
# DDP path often guards some saves and not others: SSRGAN-PyTorch's `*-last.pth`)
OWN_DDP_PATH = (ExistingDdpTransform, SetEpochTransform, RankZeroTransform, ProcessGroupTransform, ImportsTransform)
# Project mode (ddpify.project): an entry script whose training runs in imported modules,
# and an imported module that only prints, saves or names DataParallel.
ENTRY_TRANSFORMS = (
    DevicesTransform, WrapSwitchesTransform, RankZeroTransform, RunNamesTransform, OwnInitTransform, ProcessGroupTransform,
    ImportsTransform,
)
LIBRARY_SIDE_EFFECTS = (
    # (a step function there decides on the mean loss: SRFBN's solver skips a step on its loss)
    # (and its loss classes weight their masked means: FastSpeech2's model/loss.py)
    DevicesTransform, WrapModelTransform, SelectedMeansTransform, DecisionsTransform, RankZeroTransform, OwnInitTransform,
    ProcessGroupTransform, ImportsTransform,
)
