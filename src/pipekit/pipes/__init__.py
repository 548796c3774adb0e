"""pipekit's DataPipes.

Importing :mod:`pipekit` (or this package) registers every functional name,
so pipes chain: ``IterableWrapper(urls).open_files_by_fsspec().decode_image()``.
Every pipe is also exported under torchdata 0.9's class name, so
``from torchdata.datapipes.iter import X`` becomes ``from pipekit.pipes import X``;
the map-style pipes of ``torchdata.datapipes.map`` whose names clash with
iterable ones are exported with a ``Map`` prefix (``MapBatcher``,
``MapInMemoryCacheHolder``, ``MapUnZipper``...).  The torchdata 0.9 pipes
pipekit does not have, and why, are listed in the migration guide
(``docs/migration/torchdata.md``, "Not in pipekit, deliberately").

Where each pipe lives (functional name -> module):

==========================================================  ============================
``map filter shuffle batch unbatch collate zip concat mux``  :mod:`~pipekit.pipes.builtin`
``fork demux groupby sharding_filter`` (torch's own)         :mod:`~pipekit.pipes.builtin`
``list_files_by_fsspec open_files_by_fsspec save_by_fsspec`` :mod:`~pipekit.pipes.fsspec_io`
``load_from_tar load_from_zip``                              :mod:`~pipekit.pipes.archives`
``decompress load_from_bz2 load_from_xz extract``            :mod:`~pipekit.pipes.decompress`
``webdataset shard_expand``                                  :mod:`~pipekit.pipes.webdataset`
``load_tar_samples`` (tar members grouped, as bytes)         :mod:`~pipekit.pipes.tar_samples`
``write_shards`` ``ShardWriter TarWriter``                   :mod:`~pipekit.pipes.shard_writer`
``readlines parse_csv parse_csv_as_dict parse_json_files``   :mod:`~pipekit.pipes.parsing`
``decode_image decode``                                      :mod:`~pipekit.pipes.decode`
``flatmap shuffled_flatmap map_batches threadpool_map``      :mod:`~pipekit.pipes.mapping`
``async_map_batches``                                        :mod:`~pipekit.pipes.mapping`
``header cycle repeat enumerate add_index set_length``       :mod:`~pipekit.pipes.flow`
``zip_longest zip_with_iter zip_with_map``                   :mod:`~pipekit.pipes.zipping`
``mux_longest`` ``SampleMultiplexer``                        :mod:`~pipekit.pipes.multiplexing`
``random_split round_robin_demux unzip``                     :mod:`~pipekit.pipes.splitting`
``to_map_datapipe`` (iter) ``to_iter_datapipe`` (map)        :mod:`~pipekit.pipes.conversion`
``bucketbatch max_token_bucketize in_batch_shuffle``         :mod:`~pipekit.pipes.bucketing`
``pad_collate``                                              :mod:`~pipekit.pipes.collate`
``in_memory_cache``                                          :mod:`~pipekit.pipes.memory_cache`
``in_memory_cache unzip`` (on map-style pipes)               :mod:`~pipekit.pipes.mapstyle`
``on_disk_cache end_caching``                                :mod:`~pipekit.pipes.disk_cache`
``prefetch pin_memory``                                      :mod:`~pipekit.pipes.prefetch`
``read_from_http``                                           :mod:`~pipekit.pipes.http`
``check_hash``                                               :mod:`~pipekit.pipes.hashing`
``drop slice flatten rows2columnar lines_to_paragraphs``     :mod:`~pipekit.pipes.columns`
``fullsync``                                                 :mod:`~pipekit.pipes.distributed`
``append_index normalize augment augment_batch``             :mod:`~pipekit.pipes.sample_transforms`
``read_geo`` (bounding boxes -> geo samples)                 :mod:`pipekit.geo.pipes`
``list_files_by_fsspec ... save_to_disk``                    :mod:`~pipekit.pipes.fsspec_io`
==========================================================  ============================

``pipekit.pipes.base.owner_of("decode_image")`` answers the same question at run time.
"""

from pipekit.pipes.archives import *
from pipekit.pipes.base import IterDataPipe, MapDataPipe, Resumable, functional_datapipe
from pipekit.pipes.bucketing import *
from pipekit.pipes.builtin import *
from pipekit.pipes.collate import *
from pipekit.pipes.columns import *
from pipekit.pipes.conversion import *
from pipekit.pipes.decompress import *
from pipekit.pipes.decode import *
from pipekit.pipes.disk_cache import *
from pipekit.pipes.distributed import *
from pipekit.pipes.flow import *
from pipekit.pipes.fsspec_io import *
from pipekit.pipes.hashing import *
from pipekit.pipes.http import *
from pipekit.pipes.memory_cache import *
from pipekit.pipes.multiplexing import *
from pipekit.pipes.parsing import *
from pipekit.pipes.prefetch import *
from pipekit.pipes.splitting import *
from pipekit.pipes.mapping import *
from pipekit.pipes.mapstyle import *
from pipekit.pipes.sample_transforms import *
from pipekit.pipes.shard_writer import *
from pipekit.pipes.tar_samples import *
from pipekit.pipes.webdataset import *
from pipekit.pipes.zipping import *
from pipekit.pipes import (
    archives,
    bucketing,
    builtin,
    collate,
    columns,
    conversion,
    decompress,
    decode,
    disk_cache,
    distributed,
    flow,
    fsspec_io,
    hashing,
    http,
    memory_cache,
    multiplexing,
    parsing,
    prefetch,
    splitting,
    mapping,
    mapstyle,
    sample_transforms,
    shard_writer,
    tar_samples,
    webdataset,
    zipping,
)

__all__ = sorted(
    {
        "IterDataPipe",
        "MapDataPipe",
        "Resumable",
        "functional_datapipe",
        *archives.__all__,
        *bucketing.__all__,
        *builtin.__all__,
        *collate.__all__,
        *columns.__all__,
        *conversion.__all__,
        *decompress.__all__,
        *decode.__all__,
        *disk_cache.__all__,
        *distributed.__all__,
        *flow.__all__,
        *fsspec_io.__all__,
        *hashing.__all__,
        *http.__all__,
        *memory_cache.__all__,
        *multiplexing.__all__,
        *parsing.__all__,
        *prefetch.__all__,
        *splitting.__all__,
        *mapping.__all__,
        *mapstyle.__all__,
        *sample_transforms.__all__,
        *shard_writer.__all__,
        *tar_samples.__all__,
        *webdataset.__all__,
        *zipping.__all__,
    }
)
