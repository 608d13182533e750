"""Deployment: the Helm chart, its values schema, scrape relabelling and file_sd targets."""
