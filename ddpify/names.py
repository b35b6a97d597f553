"""Qualified names and words both the converter and the checker recognise (no imports)."""

DATA_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
}
DATA_PARALLEL_FUNCTION = {
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
    # DataParallel written by hand from its parts (wavenet_vocoder's data_parallel_workaround)
    "torch.nn.parallel.replicate",
    "torch.nn.parallel.replicate.replicate",
    "torch.nn.parallel.parallel_apply",
    "torch.nn.parallel.parallel_apply.parallel_apply",
}
DDP = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
}
SAMPLER = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
DATA_LOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
SUMMARY_WRITERS = {
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
}
# Calls that return an experiment-tracker object: made on rank 0 only, its method calls guarded.
TRACKER_FACTORIES = SUMMARY_WRITERS | {
    "wandb.init", "comet_ml.Experiment", "comet_ml.OfflineExperiment", "visdom.Visdom",
    # (learning-tsp's `from tensorboard_logger import Logger as TbLogger`: an event file named by
    # the second and the host, opened 'wb', that ranks starting together overwrite)
    "tensorboard_logger.Logger", "tensorboardX.GlobalSummaryWriter", "neptune.init", "neptune.init_run",
    "aim.Run", "dvclive.Live", "clearml.Task.init",
}
# Calls that write a file (checkpoints, images, arrays, audio, objects): rank 0's in a converted
# run, whether the script or a project module it calls makes them.
FILE_WRITERS = {
    "torch.save", "torch.jit.save", "torch.onnx.export", "torchvision.utils.save_image",
    *(f"numpy.{name}" for name in ("save", "savez", "savez_compressed", "savetxt")),
    "matplotlib.pyplot.savefig", "cv2.imwrite", *(f"imageio.{name}" for name in ("imwrite", "imsave", "mimsave")),
    "librosa.output.write_wav", "soundfile.write", "scipy.io.wavfile.write", "torchaudio.save", "joblib.dump",
    "scipy.io.savemat",
}
# Matrix products: one of the batch with its own transpose compares every pair of samples
# (read by the same rule in the script, transforms/batch_losses.py, and in project modules).
MATRIX_PRODUCTS = {"mm", "matmul", "addmm", "addmm_", "baddbmm"}
# Schedulers that decide from a metric the script passes in: it must be the same on every rank.
METRIC_SCHEDULERS = {"torch.optim.lr_scheduler.ReduceLROnPlateau"}
PROGRESS_BARS = {f"tqdm.{module}{name}" for module in ("", "auto.", "notebook.", "std.") for name in ("tqdm", "trange")}
# Mode letters of open() that write (shared by the converter and the verify probe).
WRITE_MODES = "wax+"
# Names in an `if` test that show the code below is already limited to one rank.
RANK_WORDS = ("rank", "main_process", "is_master", "is_main")
# Names of DataParallel variants end so (`CustomDataParallel`; PyTorch-Encoding's two classes).
# (Synchronized-BatchNorm-PyTorch's `DataParallelWithCallback`, vendored by SPADE, TFPnP and many GANs)
VARIANT_ENDINGS = ("DataParallel", "DataParallelModel", "DataParallelCriterion", "DataParallelWithCallback")
# Methods that make a class a fork of DataParallel (its own batch splitting across GPUs).
DATA_PARALLEL_METHODS = {"scatter", "gather", "replicate", "parallel_apply"}


def has_word(source: str, word: str) -> bool:
    """`word` in the text with no identifier character right before or after it: the text
    pre-filter for DataParallel (not DistributedDataParallel or FullyShardedDataParallel)."""
    offset = source.find(word)
    while offset != -1:
        before, after = source[offset - 1 : offset], source[offset + len(word) : offset + len(word) + 1]
        if not (before.isidentifier() or before.isdigit() or after.isidentifier() or after.isdigit()):
            return True
        offset = source.find(word, offset + 1)
    return False


def mentions_data_parallel(source: str) -> bool:
    """The convert pre-filter: torch's DataParallel, its functional ``data_parallel``, or a
    ``*DataParallel`` variant (reported, not converted; see engine.variant_refusal)."""
    if has_word(source, "DataParallel") or has_word(source, "data_parallel") or has_word(source, "parallel_apply"):
        return True
    return names_data_parallel_variant(source)


def variant_name(name: str) -> bool:
    """A name for a DataParallel variant (``BalancedDataParallel``, ``DataParallelModel``,
    a project's own ``DataParallel``), not for DDP or FSDP."""
    return name.endswith(VARIANT_ENDINGS) and "Distributed" not in name and "Sharded" not in name


def names_data_parallel_variant(source: str) -> bool:
    """Whether the text holds a name that variant_name may accept: one that ends in a
    VARIANT_ENDINGS word, other than DistributedDataParallel and (Fully)ShardedDataParallel."""
    if "DataParallel" not in source:
        return False
    text = source.replace("DistributedDataParallel", "").replace("ShardedDataParallel", "")
    offset = text.find("DataParallel")
    while offset != -1:
        end = offset + len("DataParallel")
        for ending in ("", "Model", "Criterion", "WithCallback"):
            after = text[end + len(ending) : end + len(ending) + 1]
            if text.startswith(ending, end) and not (after.isidentifier() or after.isdigit()):
                return True
        offset = text.find("DataParallel", end)
    return False

# ProjectLinks.reexports' key for a library name a star import of a project module binds
# (`*t` -> torch: no dotted name starts so)
STAR_NAME = "*"
