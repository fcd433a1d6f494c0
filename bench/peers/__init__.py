"""Other messaging systems, started as throwaway processes, for comparison under the same client."""
