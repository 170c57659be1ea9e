"""Processes and Ray: worker groups, placement, rendezvous, devices, failures and profiles."""
