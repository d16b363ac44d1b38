"""Input files that both the live emulation and the offline replay read: the idle-node trace
(:mod:`.trace`) and the bounded readers that check every input file as untrusted
(:mod:`.errors`). Nothing here imports the replay or the executor."""
