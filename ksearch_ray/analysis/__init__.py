"""Experiments' analysis: run directories into polars frames (`runs`), summaries over seeds
(`summary`), Markdown tables (`tables`) and plots (`plots`). Reads run directories only."""
