"""The data-wrangling job (fm_data_tasks): data, prompt templates, metrics, and `flexbatch wrangle`."""
