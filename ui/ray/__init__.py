"""Scale-out on Ray: the worker pool behind `mixgraph serve --ray`, its workers, fan-out."""
