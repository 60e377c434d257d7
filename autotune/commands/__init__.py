"""What a command does beyond reading its options and printing its result, where no
pipeline module (``autotune.profiling``, ``autotune.bench``, ``autotune.verify``,
``autotune.training.job``) holds it: the quick checks before long work, and the files a
command writes."""
