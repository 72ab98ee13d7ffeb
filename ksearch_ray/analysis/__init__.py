"""Experiments' analysis: run directories into polars frames (`runs`), summaries over seeds
(`curves`), Markdown tables (`markdown`) and plots (`plots`). Reads run directories only."""
