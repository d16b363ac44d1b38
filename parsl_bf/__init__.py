"""parsl_bf: elastic DNN training on the idle nodes a batch scheduler cannot fill."""

__version__ = "0.1.0"
